"""What starting and stopping does to a simulated guest.

Starting launches QEMU with the config as it is after ``vmconfig_apply_pending``; the guest
then boots, and cloud-init reads the seed on its CD-ROM. That is when the simulator reads an
attached seed ISO: if its vendor-data installs ``qemu-guest-agent``, the guest has an agent
from then on (seed 000 entry 7). A CD-ROM whose ISO is gone makes QEMU exit at launch.
"""

from __future__ import annotations

from .configupdate import apply_pending
from .seedreader import installs_guest_agent
from .state import Cluster, Guest, TaskError


def check_media(cluster: Cluster, guest: Guest) -> None:
    """QEMU cannot open a CD-ROM image that is not there: the start fails."""
    for key, drive in guest.drives():
        if not drive.is_cdrom or drive.is_cloudinit or drive.volid in ("none", "cdrom", ""):
            continue
        if ":" in drive.volid and cluster.volume(guest.node, drive.volid) is None:
            storage = cluster.storage(guest.node, drive.storage or "")
            base = storage.path if storage and storage.path else "/mnt/pve/missing"
            path = f"{base}/template/{drive.volname}"
            raise TaskError(
                f"kvm: -drive file={path},if=none,id=drive-{key},media=cdrom: "
                f"Could not open '{path}': No such file or directory\n"
                "start failed: QEMU exited with code 1"
            )


def read_seeds(cluster: Cluster, guest: Guest) -> None:
    """cloud-init at first boot: a seed whose vendor-data installs the agent installs it."""
    for _key, drive in guest.drives():
        if not drive.is_cdrom or ":" not in drive.volid:
            continue
        found = cluster.volume(guest.node, drive.volid)
        if found is None:
            continue
        volume = found[1]
        if volume.installs_agent is None:
            volume.installs_agent = bool(volume.data) and installs_guest_agent(volume.data or b"")
        if volume.installs_agent:
            guest.agent_installed = True


def launch(cluster: Cluster, guest: Guest, at: float, *, apply: bool = True) -> None:
    """QEMU runs from ``at``: pending changes applied first (unless resuming from disk)."""
    if apply:
        apply_pending(cluster, guest)
    read_seeds(cluster, guest)
    guest.status = "running"
    guest.qmpstatus = "running"
    guest.booted_at = at
    node = cluster.nodes[guest.node]
    guest.pid = 100000 + node.next_pid % 3000000
    node.next_pid += 1


def power_off(guest: Guest) -> None:
    guest.status = "stopped"
    guest.qmpstatus = "stopped"
    guest.booted_at = None
    guest.pid = 0


def restart(cluster: Cluster, guest: Guest, at: float) -> None:
    """A reboot through Proxmox: QEMU exits and ``qm cleanup`` starts it again (§7.16)."""
    power_off(guest)
    launch(cluster, guest, at)
