"""Fixtures for the simulator's own tests: an engine on a manual clock, and the seam over it.

Every test drives the engine through ``provisioning.proxmox.api.Api`` over ``SimTransport``,
so each one also proves the seam carries that request and that answer. ``raw`` talks to the
engine directly for what the seam hides on purpose (reason phrases, body bytes, delays).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pycdlib
import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.clock import ManualClock
from pvesim.protocol import SimRequest, SimResponse
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport, sim_api

SECRET = "0b7c3a52-8f0e-4c55-9d1e-6a2f4b8c9d10"
TOKEN = f"proxyhub@pve!sim={SECRET}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def engine(clock: ManualClock) -> Simulator:
    """The default cluster, every task instant, time moved only by the test."""
    return Simulator(profile="instant", clock=clock, token_secret=SECRET)


@pytest.fixture
def sim(engine: Simulator) -> tuple[Api, Simulator]:
    return sim_api(engine)


@pytest.fixture
def api(sim: tuple[Api, Simulator]) -> Api:
    return sim[0]


@dataclass
class Timed:
    """The ``fast`` profile on the manual clock: tasks take time, and only the test moves it."""

    api: Api
    engine: Simulator
    clock: ManualClock

    def advance(self, seconds: float) -> None:
        self.engine.control.advance(seconds)

    def wait(self, upid: str, node: str = "pve1", step: float = 0.05) -> dict[str, Any]:
        """Poll a task like a client does, moving the clock between polls."""
        for _ in range(10000):
            status = self.api.task_status(node, upid)
            if status["status"] == "stopped":
                return status
            self.advance(step)
        raise AssertionError(f"task {upid} never ended")


@pytest.fixture
def timed(clock: ManualClock) -> Timed:
    engine = Simulator(profile="fast", clock=clock, token_secret=SECRET)
    return Timed(Api(SimTransport(engine)), engine, clock)


def _finished(api: Api, upid: str, node: str = "pve1") -> dict[str, Any]:
    status = api.task_status(node, upid)
    assert status["status"] == "stopped", status
    return status


@pytest.fixture
def finished(api: Api) -> Callable[..., dict[str, Any]]:
    """``finished(upid, node="pve1")``: the status of a task that must already have ended."""
    return lambda upid, node="pve1": _finished(api, upid, node)


@pytest.fixture
def exitstatus(api: Api) -> Callable[..., str]:
    """``exitstatus(upid, node="pve1")`` of an ended task."""
    return lambda upid, node="pve1": str(_finished(api, upid, node)["exitstatus"])


def _api_error(fn: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        fn()
    return caught.value


@pytest.fixture
def api_error() -> Callable[[Callable[[], Any]], ApiError]:
    """``api_error(lambda: ...)``: the ``ApiError`` the call must raise."""
    return _api_error


@pytest.fixture
def secret() -> str:
    return SECRET


@dataclass
class Raw:
    """Requests straight to the engine, for what the seam does not show."""

    engine: Simulator

    def __call__(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        form: dict[str, str] | None = None,
        token: str | None = TOKEN,
        body_length: int = 0,
        json_body: object | None = None,
    ) -> SimResponse:
        headers = {"authorization": f"PVEAPIToken={token}"} if token else {}
        return self.engine.handle(
            SimRequest(
                method=method,
                path=path,
                query=query or {},
                form=form or {},
                headers=headers,
                body_length=body_length,
                json_body=json_body,
            )
        )

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self(method, path, **kwargs)
        assert answer.body is not None
        return json.loads(answer.body)


@pytest.fixture
def raw(engine: Simulator) -> Raw:
    return Raw(engine)


def _seed_iso(vendor_data: bytes | None, user_data: bytes = b"#cloud-config\n") -> bytes:
    """A NoCloud seed shaped like proxyhub's (Rock Ridge and Joliet names)."""
    files = {"user-data": user_data, "meta-data": b"instance-id: test\nlocal-hostname: t\n"}
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


@pytest.fixture
def seed_iso() -> Callable[..., bytes]:
    """``seed_iso(vendor_data, user_data=...)``: ISO bytes; ``vendor_data=None`` leaves it out."""
    return _seed_iso


@pytest.fixture
def agent_vendor_data() -> bytes:
    """Vendor-data that installs the guest agent, as proxyhub writes it."""
    return (
        b"#cloud-config\npackages:\n  - qemu-guest-agent\n"
        b"runcmd:\n  - systemctl enable --now qemu-guest-agent\n"
    )


@pytest.fixture
def new_vm(api: Api) -> Iterator[Callable[..., int]]:
    """Clone a template into a stopped VM (instant profile) and return its VMID."""
    counter = iter(range(100100, 100200))

    def make(template: int = 9000, node: str = "pve1", **kwargs: Any) -> int:
        vmid = next(counter)
        upid = api.clone(node, template, newid=vmid, name=f"proxy-t{vmid}", **kwargs)
        assert _finished(api, upid, node)["exitstatus"] == "OK"
        return vmid

    yield make
