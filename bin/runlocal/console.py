"""What the terminal hears from run-local itself: its ``[run-local]`` lines and its one error."""

from __future__ import annotations

import sys


class RunError(Exception):
    """A step failed; the message says which and what to look at."""


def say(text: str) -> None:
    print(f"[run-local] {text}", file=sys.stderr, flush=True)
