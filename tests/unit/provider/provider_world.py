"""The provider tests' world: the in-process simulator on a manual clock.

``World`` drives the provider's step machine the way proxyhub's tasks do, except that a
``wait`` moves the simulator's clock instead of sleeping, so minutes of Proxmox work take
milliseconds and every interleaving is exact.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provisioning.proxmox.api import Api
from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.seed import seed_iso_name, seed_volid
from provisioning.proxmox.steps import Progress, StepResult
from pvesim.clock import ManualClock
from pvesim.simulator import Simulator
from tests.support.simtransport import sim_api

INSTALLATION = "inst-test"
GOOD_TEMPLATE = 9000
NOAGENT_TEMPLATE = 9001
CLOUDINIT_TEMPLATE = 9002


def catalogue(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "pvesim",
        "url": "https://127.0.0.1:8006",
        "tokenFile": "/nonexistent/token",
        "nodes": ["pve1", "pve2", "pve3"],
        "isoStorage": "proxy-seeds",
        "templates": {
            "debian-13": {"vmid": GOOD_TEMPLATE},
            "debian-13-noagent": {"vmid": NOAGENT_TEMPLATE},
            "debian-13-cloudinit": {"vmid": CLOUDINIT_TEMPLATE},
        },
        "machineTypes": {
            "small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10},
            "tiny": {"cores": 1, "memoryMiB": 512, "diskGiB": 2},
            "nodisk": {"cores": 2, "memoryMiB": 2048},
        },
    }
    data.update(overrides)
    return data


@dataclass
class World:
    api: Api
    engine: Simulator
    clock: ManualClock
    config: ProxmoxConfig
    provider: Provider
    results: list[StepResult] = field(default_factory=list)

    def fresh_provider(self) -> Provider:
        """A new provider sharing nothing with the old one but Proxmox (a restarted worker)."""
        return Provider(self.api, self.config, budgets=self.provider.budgets, clock=self.clock)

    def request(self, name: str = "a", **kwargs: Any) -> CreateRequest:
        fields: dict[str, Any] = {
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "vm_name": f"proxy-{name}",
            "machine_type": "small",
            "image": "debian-13",
            "zone": "pve1",
            "cloud_init": b"#cloud-config\nhostname: test\n",
        }
        fields.update(kwargs)
        return CreateRequest(**fields)

    def seed_volid(self, req: CreateRequest) -> str:
        """The volume id of ``req``'s seed in this world's installation."""
        name = seed_iso_name(req.vm_name, installation_id=self.config.installation_id, uid=req.uid)
        return seed_volid(self.config.iso_storage, name)

    def step(
        self,
        run: Callable[[Progress], StepResult],
        progress: Progress,
    ) -> StepResult:
        result = run(progress)
        self.results.append(result)
        if result.status == "wait":
            self.engine.control.advance(result.delay)
        return result

    def drive(
        self,
        run: Callable[[Progress], StepResult],
        progress: Progress,
        *,
        max_steps: int = 10_000,
    ) -> StepResult:
        """Run steps until done or error, moving the clock on waits."""
        for _ in range(max_steps):
            result = self.step(run, progress)
            progress = result.progress
            if result.status in ("done", "error"):
                return result
        raise AssertionError("the step machine never finished")

    def create(self, req: CreateRequest, provider: Provider | None = None) -> StepResult:
        p = provider or self.provider
        return self.drive(lambda pr: p.create_step(req, pr), p.new_create_progress())

    def delete(self, req: DeleteRequest, provider: Provider | None = None) -> StepResult:
        p = provider or self.provider
        return self.drive(lambda pr: p.delete_step(req, pr), p.new_delete_progress())

    def mutations(self) -> list[tuple[str, str | None]]:
        return [(e.method, e.key) for e in self.engine.ledger.mutations()]

    def vms_named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.api.cluster_resources() if e.get("name") == name]

    def settle(self, seconds: float = 15.0) -> None:
        """Let pvestatd's lag pass so listings show names and states."""
        self.engine.control.advance(seconds)


def make_world(profile: str = "fast", **overrides: Any) -> World:
    clock = ManualClock(start=1_800_000_000.0)
    api, engine = sim_api(profile=profile, clock=clock)
    config = ProxmoxConfig.from_mapping(catalogue(**overrides), installation_id=INSTALLATION)
    # Polls every 50 ms of simulated time, so a create ends soon after the VM runs.
    provider = Provider(api, config, budgets=Budgets(poll_interval=0.05), clock=clock)
    return World(api, engine, clock, config, provider)
