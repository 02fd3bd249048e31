"""The cluster one lifecycle run targets, and the catalogue the run uses on it."""

from __future__ import annotations

from dataclasses import dataclass

from provisioning.proxmox.api import Api
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.provider import Provider

ENV = (
    "PROXMOX_TEST_URL",
    "PROXMOX_TEST_TOKEN_FILE",
    "PROXMOX_TEST_CA_FILE",
    "PROXMOX_TEST_NODE",
    "PROXMOX_TEST_TEMPLATE_VMID",
    "PROXMOX_TEST_ISO_STORAGE",
)


@dataclass
class Target:
    """One cluster to run the lifecycle on, and the names this run may use."""

    kind: str  # "simulator" or "real"
    api: Api
    config: ProxmoxConfig
    node: str
    template_vmid: int
    prefix: str
    # How long a guest may take to report an address (seed 000 entry 7: about 50 s on a real
    # node, well under a second on the simulator's fast profile).
    address_seconds: float

    @property
    def provider(self) -> Provider:
        return Provider(self.api, self.config)

    def request_name(self, what: str) -> str:
        return f"{self.prefix}-{what}"


def lifecycle_config(
    *,
    url: str,
    token_file: str,
    ca_file: str,
    node: str,
    template: int,
    iso_storage: str,
    installation: str,
) -> ProxmoxConfig:
    """A one-node catalogue with one template and one small machine type (no disk resize, so
    any template's disk size will do)."""
    return ProxmoxConfig.from_mapping(
        {
            "name": "lifecycle",
            "url": url,
            "tokenFile": token_file,
            "caFile": ca_file,
            "nodes": [node],
            "isoStorage": iso_storage,
            "templates": {"lifecycle": {"vmid": template}},
            "machineTypes": {"lifecycle": {"cores": 1, "memoryMiB": 1024}},
        },
        installation_id=installation,
    )
