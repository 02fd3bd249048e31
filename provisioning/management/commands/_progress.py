"""Progress output for bulk commands: a bar on a terminal, plain lines otherwise.

A log collector or a CI job reads the plain lines; a person at a terminal sees one bar that
redraws in place instead of hundreds of lines. Not a command (the leading underscore keeps it
out of ``manage.py help``).
"""

from __future__ import annotations

from django.core.management.base import OutputWrapper

_WIDTH = 30


class Progress:
    """``update`` redraws the bar on a terminal; ``line`` prints only when not on one."""

    def __init__(self, out: OutputWrapper, total: int) -> None:
        self.out = out
        self.total = total
        self.tty = out.isatty()
        self._drawn = False

    def update(self, done: int, label: str = "") -> None:
        if not self.tty:
            return
        filled = _WIDTH * done // self.total if self.total else _WIDTH
        bar = "#" * filled + "-" * (_WIDTH - filled)
        text = f"[{bar}] {done}/{self.total} {label}".rstrip()
        # Pad so a shorter label fully covers a longer one drawn before it.
        self.out.write(f"\r{text:<{_WIDTH + 40}}", ending="")
        self.out.flush()
        self._drawn = True

    def line(self, text: str) -> None:
        if not self.tty:
            self.out.write(text)

    def finish(self) -> None:
        if self.tty and self._drawn:
            self.out.write("")
            self._drawn = False
