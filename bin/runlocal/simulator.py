"""The bundled Proxmox simulator as a child of run-local: started, ready, catalogue imported."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .console import RunError
from .django_commands import manage
from .processes import stop_process

SIM_READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class SimInfo:
    """The simulator's ready line (DESIGN.md §7)."""

    url: str
    token_file: str
    ca_file: str
    catalogue: str

    def env(self) -> dict[str, str]:
        """What the Procfile's processes get to know about the simulator (paths, no secret)."""
        return {
            "PVESIM_URL": self.url,
            "PVESIM_TOKEN_FILE": self.token_file,
            "PVESIM_CA_FILE": self.ca_file,
            "PVESIM_CATALOGUE": self.catalogue,
        }


def start_simulator(
    python: str,
    *,
    workdir: Path,
    port: int,
    profile: str,
    time_scale: float,
    env: Mapping[str, str],
    timeout: float = SIM_READY_TIMEOUT,
) -> tuple[subprocess.Popen[bytes], SimInfo]:
    """Start ``python -m pvesim`` and wait for its ready line.

    The simulator prints exactly one JSON line on stdout when it serves; everything else goes
    to stderr, which is left on the terminal. On failure the child is stopped before raising.
    """
    cmd = [
        python,
        "-m",
        "pvesim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--profile",
        profile,
        "--time-scale",
        str(time_scale),
        "--workdir",
        str(workdir),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(env), stdout=subprocess.PIPE)  # noqa: S603
    try:
        line = _read_line(proc, timeout)
        info = json.loads(line)
        return proc, SimInfo(
            url=info["url"],
            token_file=info["tokenFile"],
            ca_file=info["caFile"],
            catalogue=info["catalogue"],
        )
    except (RunError, ValueError, KeyError, TypeError) as exc:
        stop_process(proc, "simulator")
        if isinstance(exc, RunError):
            raise
        raise RunError(f"the simulator's ready line is not the documented JSON: {exc}") from None


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunError(f"the simulator printed no ready line within {timeout:.0f} s")
            if not selector.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                code = proc.wait()
                raise RunError(f"the simulator exited ({code}) before it was ready")
            buffer += chunk
    return buffer.split(b"\n", 1)[0].decode("utf-8")


def import_catalogue(python: str, env: Mapping[str, str], info: SimInfo) -> None:
    """The simulator's catalogue as cluster ``pvesim``, through ``manage.py import_catalogue``."""
    manage(python, ["import_catalogue", info.catalogue], env, "importing the catalogue")
