"""The pool's parent-death signal goes through proxyhub's ctypes call (``proxyhub.celery``).

``proxyhub.celery`` replaces a private name of ``celery.platforms`` so that pool processes do not
import pycparser (issue 12: the worker's memory). A Celery release that renamed it would bring
the cost back silently; these tests fail instead.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import sys

import pytest
from celery import platforms

import proxyhub.celery as proxyhub_celery

_PR_GET_PDEATHSIG = 2

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def test_celery_still_calls_the_name_proxyhub_replaces() -> None:
    assert "_set_pdeathsig" in platforms.set_pdeathsig.__code__.co_names
    assert platforms._set_pdeathsig is proxyhub_celery._set_pdeathsig


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    platforms.set_pdeathsig("SIGKILL")
    libc = ctypes.CDLL(None, use_errno=True)
    got = ctypes.c_int(0)
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(got), 0, 0, 0)
    queue.put((got.value, "pycparser" in sys.modules))


def test_a_process_that_sets_it_dies_with_its_parent_and_loads_no_c_parser() -> None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(queue,))
    process.start()
    signum, parser_loaded = queue.get(timeout=60)
    process.join(timeout=60)
    assert signum == signal.SIGKILL
    assert not parser_loaded
