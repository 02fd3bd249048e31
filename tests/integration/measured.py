"""Figures the integration tier measures for the record, never to pass or fail on (STYLE.md:
timing belongs in ``benchmarks/``, except where the issue itself states a bound).

A test calls the ``measure`` fixture; each figure is printed, written as JSON under the test's
tmp dir (``measurements.json``) and under the stack's log directory (one file for the session),
and listed in a section of pytest's terminal summary, so a run's figures can be quoted without
rerunning anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class Measure(Protocol):
    def __call__(self, what: str, value: float, unit: str, **context: Any) -> None: ...


# Every figure of this session, in the order measured.
SESSION: list[dict[str, Any]] = []


def record(entry: dict[str, Any], *paths: Path) -> None:
    SESSION.append(entry)
    line = json.dumps(entry, sort_keys=True)
    print(f"measured: {line}")
    for path in paths:
        existing = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*existing, entry], indent=2, sort_keys=True))
