"""Where benchmark results go: the full report of each run, and the headline figures of all.

* ``benchmarks/results/<name>-<date>.json``: a JSON array, one full report appended per run
  (every number the run measured, for reading later);
* ``benchmarks/results/latest.json``: one JSON object, figure name → ``{value, target, unit,
  measured_at, commit, details}``, each benchmark merging in its headline figures, so the last
  measured value of every figure and the target the issues set for it sit in one place.
  ``target`` is the upper bound the issue sets (every target so far is "at most"), ``null``
  when none is set; it is copied from the benchmark, never derived from a measurement.

Benchmarks only; nothing here imports Django.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
LATEST = RESULTS / "latest.json"


@dataclass(frozen=True)
class Figure:
    """One headline figure of a run."""

    value: float | int | None
    target: float | int | None
    unit: str
    details: Mapping[str, Any] = field(default_factory=dict)


def variant(**knobs: tuple[float | int, float | int]) -> str:
    """The suffix of a figure's name measured with knobs off their defaults (``knob=(value,
    default)``), so a run with other settings records beside the headline figure rather than
    replacing it: ``variant(concurrency=(4, 1), poll=(1.0, 1.0))`` is ``"_concurrency4"``."""
    return "".join(
        f"_{name}{value:g}" for name, (value, default) in knobs.items() if value != default
    )


def git_commit() -> str:
    """The short commit the run measured (``+dirty`` when tracked files outside the results
    differ from it)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            # Results written by an earlier benchmark of the same `make bench` are not a change.
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!benchmarks/results",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``uptime``), recorded with every run: the figures
    mean little without the machine's load beside them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def append_report(name: str, report: Mapping[str, Any], out: Path | None = None) -> Path:
    """Append ``report`` to ``results/<name>-<date>.json`` (or ``out``); returns the file."""
    path = out or RESULTS / f"{name}-{datetime.now(UTC):%Y-%m-%d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    existing: Any = json.loads(path.read_text()) if path.exists() else []
    if isinstance(existing, dict):
        existing = [existing]
    existing.append(report)
    _write(path, json.dumps(existing, indent=2) + "\n")
    return path


def record_latest(
    figures: Mapping[str, Figure],
    *,
    measured_at: str | None = None,
    commit: str | None = None,
    path: Path = LATEST,
) -> Path:
    """Merge ``figures`` into ``latest.json``: each name's entry is replaced, others are kept."""
    when = measured_at or now_iso()
    rev = commit or git_commit()
    current: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for name, fig in figures.items():
        current[name] = {
            "value": fig.value,
            "target": fig.target,
            "unit": fig.unit,
            "measured_at": when,
            "commit": rev,
            "details": dict(fig.details),
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(dict(sorted(current.items())), indent=2) + "\n")
    return path


def record_suite(
    figures: Mapping[str, Figure],
    *,
    section: str = "suite",
    flat: bool = True,
    measured_at: str | None = None,
    commit: str | None = None,
    path: Path = LATEST,
) -> Path:
    """Merge issue 12's suite (benchmarks/suite.py) into ``latest.json``.

    The issue asks for one object whose keys are the figures and whose values are numbers, so
    with ``flat`` each figure is written at the top level as its bare number; its full record
    (``{value, target, unit, measured_at, commit, details}``, as every other figure has) goes
    under ``section`` → name. Smoke runs (``flat=False``) write only their section, so a
    small-size check never stands in for a real figure. Other figures are kept as they are.
    """
    when = measured_at or now_iso()
    rev = commit or git_commit()
    current: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    records = dict(current.get(section) or {})
    for name, fig in figures.items():
        records[name] = {
            "value": fig.value,
            "target": fig.target,
            "unit": fig.unit,
            "measured_at": when,
            "commit": rev,
            "details": dict(fig.details),
        }
        if flat:
            current[name] = fig.value
    current[section] = dict(sorted(records.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(dict(sorted(current.items())), indent=2) + "\n")
    return path


def _write(path: Path, text: str) -> None:
    """Replace ``path`` whole, so a benchmark killed mid-write leaves the old file intact."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
