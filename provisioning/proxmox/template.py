"""What a proxy's VM takes from its template (seed 000 entry 4, entry 10 step 6).

The create makes a full clone, so the VM starts as a copy of the template's config. That is why
the template is judged by what the create's later steps need of the copy (``template_problem``,
checked before any VM exists, so a Permanent error never leaves a VM that fixing the template
cannot help), and why ``desired_config`` is computed from the copy: it is what the configure
step writes over it. Both are pure; the create machine and the plan preview use the same
functions, so a preview cannot drift from what the create writes.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import ProxmoxConfig
from .disks import boot_disk, cloudinit_drive, disk_size_bytes
from .marks import TAG
from .netcfg import rewrite_net0
from .seed import seed_volid

TEMPLATE_REMEDIATION = (
    "prepare the template as docs/operator-guide.md says (a template VM with a boot disk, net0, "
    "no cloud-init drive) or point the catalogue at another one"
)


def template_problem(
    config: Mapping[str, str],
    cluster: ProxmoxConfig,
    template_vmid: int,
    *,
    disk_gib: int | None = None,
) -> str | None:
    """Why a template cannot be used (entry 4), or None. ``disk_gib`` is the machine type's
    ``diskGiB``: when set, the resize (entry 6) needs the copy's boot disk and its size."""
    if str(config.get("template", "0")) != "1":
        return f"VM {template_vmid} is not a template"
    drive = cloudinit_drive(config)
    if drive:
        return (
            f"template {template_vmid} has a Proxmox cloud-init drive on {drive}, which would "
            "compete with proxyhub's seed ISO"
        )
    if (cluster.bridge or cluster.vlan_tag) and "net0" not in config:
        return f"template {template_vmid} has no net0 to put on the configured bridge or VLAN"
    if disk_gib:
        disk = boot_disk(config)
        if disk is None or disk_size_bytes(config.get(disk, "")) is None:
            return (
                f"template {template_vmid} has no boot disk with a readable size, which the "
                f"resize to diskGiB {disk_gib} needs"
            )
    return None


def desired_config(
    config: Mapping[str, str],
    cluster: ProxmoxConfig,
    vm_name: str,
    cores: int,
    memory_mib: int,
    *,
    seed_name: str,
) -> dict[str, str]:
    """The values the configure step writes (entry 10 step 6), as Proxmox stores them.
    ``seed_name`` is the seed ISO's file name (``seed.seed_iso_name``)."""
    wanted = {
        "cores": str(cores),
        "memory": str(memory_mib),
        "agent": "1",
        # The tag replaces the template's tags (entry 10): "template" on a proxy would mislead.
        "tags": TAG,
        "ide2": f"{seed_volid(cluster.iso_storage, seed_name)},media=cdrom",
    }
    if (cluster.bridge or cluster.vlan_tag) and "net0" in config:
        wanted["net0"] = rewrite_net0(
            config["net0"], bridge=cluster.bridge, vlan_tag=cluster.vlan_tag
        )
    return wanted
