"""What the browser tier starts besides the live server: the HTTPS simulator and a celery
worker as child processes (see ``conftest.py``). Plain helpers, so the test module can name
the types without importing a ``conftest``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "var" / "screenshots"


def child_env(**extra: str) -> dict[str, str]:
    """A production environment: production's settings, nothing inherited but PATH and HOME."""
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "proxyhub.settings.production",
        # The simulator's token and CA live in pytest's temporary directories.
        "PROXYHUB_CREDENTIALS_DIR": tempfile.gettempdir(),
        # Production refuses to start without a /metrics token.
        "PROXYHUB_METRICS_TOKEN": "e2e-metrics-token-not-a-secret-0123456789",
    }
    env.update(extra)
    return env


def stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM to the child's process group (a worker and its pool), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


@dataclass
class Simulator:
    url: str
    token_file: Path
    ca_file: Path
    catalogue: Path

    def control(self, name: str, **params: Any) -> Any:
        """A read of the simulator's control surface (``GET /_sim/<name>``)."""
        import requests

        reply = requests.get(
            f"{self.url}/_sim/{name}", params=params, verify=str(self.ca_file), timeout=10
        )
        reply.raise_for_status()
        return reply.json()["data"]

    def act(self, name: str, **arguments: Any) -> Any:
        """A change through the control surface (``POST /_sim/<name>``), behind proxyhub's back."""
        import requests

        reply = requests.post(
            f"{self.url}/_sim/{name}", json=arguments, verify=str(self.ca_file), timeout=10
        )
        reply.raise_for_status()
        return reply.json()["data"]

    def vms_named(self, prefix: str) -> list[dict[str, Any]]:
        """Every VM whose name starts with ``prefix``, as Proxmox lists them."""
        import requests

        token = self.token_file.read_text().strip()
        reply = requests.get(
            f"{self.url}/api2/json/cluster/resources",
            params={"type": "vm"},
            headers={"Authorization": f"PVEAPIToken={token}"},
            verify=str(self.ca_file),
            timeout=10,
        )
        reply.raise_for_status()
        return [vm for vm in reply.json()["data"] if str(vm.get("name", "")).startswith(prefix)]


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def problems(self, lines: int = 40) -> str:
        """The log's last ``lines`` lines at WARNING or above (JSON lines and celery's own)."""
        wanted = ('"level": "WARNING"', '"level": "ERROR"', '"level": "CRITICAL"', "Traceback")
        found = [
            line
            for line in self.log.read_text(errors="replace").splitlines()
            if any(mark in line for mark in wanted)
        ]
        return "\n".join(found[-lines:]) or "(none)"
