"""Remove what one lifecycle run left on a cluster, and nothing else.

Only names that start with the run's own prefix are touched, and a VM is deleted through the
provider with the uid its mark carries, so the same ownership checks guard it as any delete
(seed 000 entry 11). A failure to remove one thing does not stop the rest; what could not be
removed is reported by ``leftovers`` and raised at the end, so a run never ends quietly with
something of its own still on the cluster.
"""

from __future__ import annotations

import logging
import time

from provisioning.proxmox.api import Api
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.errors import ProxmoxError
from provisioning.proxmox.ids import format_provider_id
from provisioning.proxmox.marks import parse_mark
from provisioning.proxmox.provider import Provider

log = logging.getLogger("tests.real")


def leftovers(api: Api, config: ProxmoxConfig, prefix: str) -> list[str]:
    """VMs and seed ISOs of the run still on the cluster, as ``vm <vmid> <name>`` or a volid."""
    found = [
        f"vm {e['vmid']} {e['name']}"
        for e in api.cluster_resources()
        if e.get("type") == "qemu" and str(e.get("name", "")).startswith(prefix)
    ]
    for node in config.nodes:
        for item in api.storage_content(node, config.iso_storage, content="iso"):
            if str(item.get("volid", "")).startswith(f"{config.iso_storage}:iso/{prefix}"):
                found.append(str(item["volid"]))
    return found


def remove_leftovers(api: Api, config: ProxmoxConfig, prefix: str) -> None:
    provider = Provider(api, config)
    for entry in api.cluster_resources():
        name = str(entry.get("name", ""))
        if entry.get("type") != "qemu" or not name.startswith(prefix):
            continue
        vmid, node = int(entry["vmid"]), str(entry["node"])
        try:
            uid = parse_mark(api.vm_config(node, vmid).get("description")).uid
            provider.delete(format_provider_id(vmid, name), uid=uid)
        except ProxmoxError as err:
            log.warning(
                "lifecycle cleanup could not delete a VM", extra={"vmid": vmid, "error": str(err)}
            )
    for node in config.nodes:
        for item in api.storage_content(node, config.iso_storage, content="iso"):
            volid = str(item.get("volid", ""))
            if volid.startswith(f"{config.iso_storage}:iso/{prefix}"):
                try:
                    api.delete_volume(node, config.iso_storage, volid)
                except ProxmoxError as err:
                    log.warning(
                        "lifecycle cleanup could not delete a seed", extra={"error": str(err)}
                    )
    left = settled_leftovers(api, config, prefix)
    if left:
        raise AssertionError(f"the lifecycle run left these on the cluster: {left}")


def settled_leftovers(
    api: Api, config: ProxmoxConfig, prefix: str, seconds: float = 60.0
) -> list[str]:
    """``leftovers`` once deletes still running as tasks have had up to ``seconds`` to finish
    (a real node's volume deletes and listing lag take longer than the simulator's)."""
    end = time.monotonic() + seconds
    left = leftovers(api, config, prefix)
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = leftovers(api, config, prefix)
    return left
