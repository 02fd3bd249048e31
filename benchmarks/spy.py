"""Where a worker's time goes: py-spy sampling a running worker, summed by proxyhub's own code.

Issue 12 asks that a goal not met be profiled. ``suite.py --py-spy`` runs ``py-spy record`` on
the worker (its Celery parent and the pool process) while the makespan stage runs, and this
module turns py-spy's raw output (one collapsed stack and its sample count per line) into what a
reader needs: for each function of ``provisioning/`` and ``proxyhub/``, the share of the pool
process's busy samples spent in it or below it. A delivery's own work (Proxmox requests, the
journal, the slots) then reads as a share of the delivery, beside the Celery and Django
machinery it runs in.

py-spy slows what it samples (it stops the process at each sample), so the wall-clock figures of
a profiled run are not the benchmark's: the shares are what it is for. Sampling needs ptrace
(root, or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Frames of proxyhub's own code, by the path py-spy prints for them.
OWN = ("provisioning/", "proxyhub/", "healthchecks/")
# Samples per second: 100 costs the worker little and still gives thousands over a minute.
RATE = 100


@dataclass(frozen=True)
class Sample:
    """One collapsed stack of one process: its frames, outermost first, and how often."""

    pid: int
    frames: tuple[str, ...]
    count: int


def parse(lines: Iterable[str]) -> list[Sample]:
    """py-spy's raw format (``--format raw``): ``frame;frame;... count``, where with
    ``--subprocesses`` the leading frames name the processes (``process 123:"cmd"``); a stack
    belongs to the innermost process it names."""
    out = []
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        pid = 0
        first = 0
        for i, frame in enumerate(frames):
            if frame.startswith("process "):
                pid = int(frame.split()[1].rstrip(":").split(":")[0])
                first = i + 1
        out.append(Sample(pid, tuple(frames[first:]), int(count)))
    return out


def function_of(frame: str) -> str:
    """``name (path/to/file.py:123)`` as ``path/to/file.py:name`` (no line: a function counts
    once however many lines of it were sampled)."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{path}:{name}"


def started_thread(sample: Sample) -> bool:
    """Whether the stack is a thread's the process started (``threading.Thread``) rather than its
    main thread's. The pool process runs its steps on the main thread; its other threads (the
    lease renewer, the Proxmox calls' executor) mostly wait, and py-spy counts a timed wait as
    busy: in one profile of latency runs they held half of the pool's samples."""
    return any("_bootstrap (" in frame and "threading.py" in frame for frame in sample.frames)


def own_shares(samples: Iterable[Sample], *, pid: int, top: int = 40) -> dict[str, Any]:
    """For process ``pid``'s main thread: its busy samples and, for the ``top`` functions of
    proxyhub's code, the share of them spent in the function or below it; ``steps``: where a
    step's time goes (``step_parts``). Samples of its other threads are counted apart
    (``otherThreadSamples``), not in the shares."""
    total = 0
    others = 0
    inclusive: Counter[str] = Counter()
    mine: list[Sample] = []
    for sample in samples:
        if sample.pid != pid:
            continue
        if started_thread(sample):
            others += sample.count
            continue
        mine.append(sample)
        total += sample.count
        seen = set()
        for frame in sample.frames:
            if not any(part in frame for part in OWN):
                continue
            key = function_of(frame)
            if key not in seen:
                seen.add(key)
                inclusive[key] += sample.count
    return {
        "samples": total,
        "otherThreadSamples": others,
        "shares": {key: round(n / total, 4) for key, n in inclusive.most_common(top)}
        if total
        else {},
        "steps": step_parts(mine),
    }


# A step, as the driver runs it: everything below one call of this function.
STEP = "provisioning/services/driver.py:_run_one"


def step_parts(samples: Iterable[Sample], *, top: int = 15) -> dict[str, Any]:
    """Where a step's time goes: the samples inside ``STEP`` by the function it called (the
    operation's read, the claim, the attempt, the journal's transaction ...), each as a share
    of them. A function of Django's or Celery's called from the step itself counts under its
    own name (``QuerySet.get`` is the operation's read)."""
    total = 0
    parts: Counter[str] = Counter()
    for sample in samples:
        functions = [function_of(frame) for frame in sample.frames]
        if STEP not in functions:
            continue
        total += sample.count
        below = functions[functions.index(STEP) + 1 :]
        parts[below[0] if below else STEP] += sample.count
    return {
        "samples": total,
        "parts": {key: round(n / total, 4) for key, n in parts.most_common(top)} if total else {},
    }


def busiest_child(samples: Iterable[Sample], parent: int) -> int:
    """The pool process: the sampled process other than the Celery parent with most samples."""
    counts: Counter[int] = Counter()
    for sample in samples:
        if sample.pid != parent:
            counts[sample.pid] += sample.count
    return counts.most_common(1)[0][0] if counts else parent


def binary() -> str | None:
    """py-spy beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def available() -> str | None:
    """Why py-spy cannot run here, or None."""
    if binary() is None:
        return "py-spy is not installed (requirements-dev.txt)"
    return None


@contextmanager
def recording(pid: int, out: Path) -> Iterator[dict[str, Any]]:
    """Sample process ``pid`` and its children while the block runs; the summary (``own_shares``
    of its pool process) is put into the yielded dict when the block ends."""
    result: dict[str, Any] = {}
    spy = subprocess.Popen(
        [
            str(binary()),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--rate",
            str(RATE),
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield result
    finally:
        # py-spy writes its output when interrupted (SIGINT), as on Ctrl-C.
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if out.exists():
            samples = parse(out.read_text().splitlines())
            result.update(own_shares(samples, pid=busiest_child(samples, pid)), rate=RATE)
        else:
            result["error"] = (err or "py-spy wrote nothing").strip()[-500:]
