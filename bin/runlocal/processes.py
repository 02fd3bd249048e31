"""Web, worker and Beat from ``Procfile.local`` under honcho: started, watched, stopped.

Also how any child of run-local is stopped (the simulator too): SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from types import FrameType

from . import REPO
from .console import say
from .web_port import port_answers

STOP_GRACE = 10.0


def start_procfile(
    python: str, env: Mapping[str, str], *, web_port: int
) -> subprocess.Popen[bytes]:
    """honcho running ``Procfile.local``, whose processes get ``env`` and ``WEB_PORT``."""
    return subprocess.Popen(  # noqa: S603 - fixed command, no shell
        [
            python,
            "-m",
            "honcho",
            "--procfile",
            "Procfile.local",
            "--app-root",
            str(REPO),
            # Not .env: that file is docker compose's, with its container host names.
            "--env",
            os.devnull,
            "start",
        ],
        cwd=REPO,
        env={**env, "WEB_PORT": str(web_port)},
    )


def stop_process(proc: subprocess.Popen[bytes], name: str, grace: float = STOP_GRACE) -> int:
    """SIGTERM, wait up to ``grace``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop within {grace:.0f} s; killing it")
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return int(proc.returncode)


def supervise(
    honcho: subprocess.Popen[bytes],
    simulator: subprocess.Popen[bytes] | None,
    *,
    web_port: int,
) -> int:
    """Wait until Ctrl-C, SIGTERM or any child's exit, then stop everything; the exit code.

    Ctrl-C reaches honcho through the terminal's process group and honcho stops web, worker and
    Beat; SIGTERM is forwarded so ``kill`` on this process alone does the same. The simulator
    is stopped last, once nothing can still be talking to it.
    """
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    announced = False
    try:
        while not stopping and honcho.poll() is None:
            if simulator is not None and simulator.poll() is not None:
                say(f"the simulator exited ({simulator.returncode}); stopping everything")
                break
            if not announced and port_answers(web_port):
                say(f"ready: http://127.0.0.1:{web_port}/admin/ (Ctrl-C stops everything)")
                announced = True
            time.sleep(0.2)
        interrupted = stopping
        code = stop_process(honcho, "web, worker and Beat")
        if simulator is not None:
            stop_process(simulator, "simulator")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if interrupted:
        say("stopped")
        return 0
    return code or 1
