"""Helpers for the HTTPS tests: TLS files, a plain-``requests`` client, seed ISOs.

A module of its own (not the conftest) so test modules can import the client type and the
helpers by name; pytest puts this directory on ``sys.path`` for the tests in it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pycdlib
import requests
import trustme

from pvesim.server import SimServer
from pvesim.simulator import Simulator

SECRET = "3f0c9a7e-5b1d-4e2a-8c6f-9d7b1a2e4c50"
TOKEN = f"proxyhub@pve!sim={SECRET}"


@dataclass(frozen=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls_files(root: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(root / "ca.pem", root / "server.pem", root / "server-key.pem")
    ca.cert_pem.write_to_path(str(files.ca))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(files.key))
    return files


@dataclass
class Pve:
    """A client for one simulator over HTTPS: plain ``requests``, nothing of proxyhub's.

    This machine sets ``REQUESTS_CA_BUNDLE``, which overrides ``Session.verify``, so every
    request passes ``verify=`` itself.
    """

    server: SimServer
    engine: Simulator
    ca: str
    session: requests.Session

    def request(
        self, method: str, path: str, *, token: str | None = TOKEN, **kwargs: Any
    ) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"PVEAPIToken={token}"
        return self.session.request(
            method,
            self.server.url + "/api2/json" + path,
            headers=headers,
            verify=self.ca,
            timeout=30,
            **kwargs,
        )

    def data(self, method: str, path: str, **kwargs: Any) -> Any:
        """``data`` of a call that must succeed."""
        answer = self.request(method, path, **kwargs)
        assert answer.status_code == 200, (answer.status_code, answer.reason, answer.text)
        return answer.json()["data"]

    def control(self, name: str, **kwargs: Any) -> Any:
        """``POST /_sim/<name>`` (no token: the control surface is not Proxmox)."""
        answer = self.session.post(
            f"{self.server.url}/_sim/{name}", json=kwargs, verify=self.ca, timeout=30
        )
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return answer.json()["data"]

    def task(self, upid: str) -> dict[str, Any]:
        node = upid.split(":")[1]
        return dict(self.data("GET", f"/nodes/{node}/tasks/{quote(upid, safe='')}/status"))

    def wait(self, upid: str, step: float = 0.05) -> dict[str, Any]:
        """Poll a task to its end, moving the manual clock between polls."""
        for _ in range(2000):
            status = self.task(upid)
            if status["status"] == "stopped":
                return status
            self.control("advance", seconds=step)
        raise AssertionError(f"task {upid} never ended")


def seed_iso(vendor_data: bytes | None) -> bytes:
    """A NoCloud seed ISO like proxyhub's (``cidata``, Rock Ridge and Joliet names)."""
    files = {"user-data": b"#cloud-config\n", "meta-data": b"instance-id: t\nlocal-hostname: t\n"}
    if vendor_data is not None:
        files["vendor-data"] = vendor_data
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    for name, content in files.items():
        iso.add_fp(
            io.BytesIO(content),
            len(content),
            "/" + name.upper().replace("-", "_") + ".;1",
            rr_name=name,
            joliet_path="/" + name,
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()
