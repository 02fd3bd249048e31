"""Two commits' latency or makespan, run turn about and compared at the same machine speed.

A change to the control loop is judged by the suite's ratios, and on a shared host those move
with the host more than with most changes: one commit's makespan runs ranged from 1.28 to 2.02
within an hour (benchmarks/README.md, 2026-12-08). So this runs the suite's part on a base
commit and on the working tree turn about (base first, then the tree, ``--pairs`` times), each
from its own tree, and compares their runs with ``stats.matched_difference``: the new side's
ratio minus the base's at an equal speed probe (``speed.py``), with its standard error.

The base is checked out into a temporary worktree that uses this checkout's virtualenv; the
tree side is this checkout as it stands, uncommitted changes included. Nothing is merged into
``latest.json``; each side's suite files are kept under ``--keep`` when given.

    .venv/bin/python benchmarks/ab.py HEAD~1 --only makespan --pairs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.stats import matched_difference, spread  # noqa: E402

PARTS = ("latency", "makespan")


def runs_of(reports: Sequence[dict[str, Any]], part: str) -> list[tuple[float, float]]:
    """``(speed probe ms, ratio)`` of every run of ``part`` in a suite file's reports; a run
    recorded before the probe existed is left out."""
    out = []
    for report in reports:
        for run in report.get("result", {}).get(part, {}).get("runs", []):
            if run.get("speedProbeMs") is not None:
                out.append((float(run["speedProbeMs"]), float(run["ratio"])))
    return out


def summary(base: list[tuple[float, float]], new: list[tuple[float, float]]) -> dict[str, Any]:
    """Each side's ratios and probes (spread) and the matched difference."""
    return {
        "base": {
            "ratio": spread([r for _, r in base]),
            "speedProbeMs": spread([p for p, _ in base], digits=2),
        },
        "new": {
            "ratio": spread([r for _, r in new]),
            "speedProbeMs": spread([p for p, _ in new], digits=2),
        },
        "matched": matched_difference(base, new).as_dict(),
    }


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """``commit`` checked out in a temporary worktree using this checkout's virtualenv."""
    with tempfile.TemporaryDirectory(prefix="proxyhub-ab-") as tmp:
        path = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-f", str(path), commit],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            (path / ".venv").symlink_to(REPO / ".venv")
            yield path
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(path)],
                cwd=REPO,
                check=False,
                capture_output=True,
            )


def run_side(tree: Path, part: str, out: Path) -> None:
    """One suite run of ``part`` from ``tree``, appended to ``out``."""
    subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "python"),
            "benchmarks/suite.py",
            "--size",
            "full",
            "--only",
            part,
            "--no-latest",
            "--out",
            str(out),
        ],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare the working tree with")
    parser.add_argument("--only", choices=PARTS, default="makespan")
    parser.add_argument("--pairs", type=int, default=3, help="suite runs a side (each of 3 runs)")
    parser.add_argument("--keep", type=Path, default=None, help="a folder for both suite files")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="proxyhub-ab-out-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {"base": folder / "base.json", "new": folder / "new.json"}
        with worktree(args.base) as base_tree:
            for n in range(args.pairs):
                for side, tree in (("base", base_tree), ("new", REPO)):
                    print(f"pair {n + 1}/{args.pairs}: {side}", flush=True)
                    run_side(tree, args.only, files[side])
        sides = {
            side: runs_of(json.loads(path.read_text()), args.only) for side, path in files.items()
        }
    result = summary(sides["base"], sides["new"])
    print(json.dumps(result, indent=2))
    matched = result["matched"]
    print(
        f"\n{args.only}: new minus {args.base} at an equal speed probe: "
        f"{matched['difference']:+.3f} (standard error {matched['error']:.3f}, "
        f"{matched['baseRuns']} and {matched['newRuns']} runs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
