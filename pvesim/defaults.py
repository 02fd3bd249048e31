"""The simulator's starting states.

``default``: three nodes ``pve1``-``pve3`` (tests take ``pve3`` offline), each with

* ``local`` (dir, ``iso,vztmpl,backup``), ``local-lvm`` (lvmthin, ``images,rootdir``),
  ``proxy-seeds`` (dir, ``iso``: the seed storage seed 000 entry 15 wants dedicated);
* the shared ``vmstore`` (rbd, ``images``) holding the templates' disks, so a clone can target
  any node (entry 4);

and these guests, all outside proxyhub's default VMID range 100000-199999:

=====  ======================  ====  ==========================================================
VMID   name                    node  what it is for
=====  ======================  ====  ==========================================================
9000   debian-13               pve1  the good template: ``scsi0`` 3G, ``boot: order=scsi0``,
                                     ``agent: 1``, the guest agent baked into the image
9001   debian-13-noagent       pve1  a template whose image lacks the agent: only vendor-data
                                     that installs it gives its clones an address
9002   debian-13-cloudinit     pve1  a template with a Proxmox cloud-init drive on ``ide2``,
                                     which proxyhub must refuse (entry 4)
100    web-1                   pve1  a running VM that is not a proxy
101    proxy-legacy            pve2  a stopped ``proxy-*`` VM without any mark
102    proxy-other             pve3  a running ``proxy-*`` VM marked by *another* installation
200    ct-dns                  pve2  a running LXC container
=====  ======================  ====  ==========================================================

``empty``: the same nodes and storages, no guests (benchmarks load their own via
``Control.create_vms``).
"""

from __future__ import annotations

import uuid
from typing import Any

from .state import Cluster, Guest, Node, Storage, Volume
from .vmconfig import random_mac

GIB = 1024**3
TEMPLATE_VMID = 9000
OTHER_INSTALLATION_UID = "5b0e3f1c-8d2a-4c6b-9e7f-1a2b3c4d5e6f"

_NODES = (
    # name, index, uptime (s), maxcpu, maxmem
    ("pve1", 1, 2236708, 32, 270170554368),
    ("pve2", 2, 6256882, 16, 135089913856),
    ("pve3", 3, 1036800, 8, 67334098944),
)


def _uuid(cluster: Cluster) -> str:
    return str(uuid.UUID(int=cluster.rng.getrandbits(128), version=4))


def _fingerprint(cluster: Cluster) -> str:
    return ":".join(f"{cluster.rng.randrange(256):02X}" for _ in range(32))


def build(cluster: Cluster, state: str, now: float) -> None:
    """Fill ``cluster`` with the named starting state."""
    if state not in ("default", "empty"):
        raise ValueError(f"unknown simulator state {state!r} (one of: default, empty)")
    wall = cluster.wall(now)
    shared = Storage("vmstore", "rbd", ("images",), shared=True, total=4 * 1024 * GIB)
    for name, index, uptime, maxcpu, maxmem in _NODES:
        storages = {
            "local": Storage(
                "local",
                "dir",
                ("iso", "vztmpl", "backup"),
                shared=False,
                total=100861726720,
                base_used=5713281024,
                path="/var/lib/vz",
            ),
            "local-lvm": Storage(
                "local-lvm", "lvmthin", ("images", "rootdir"), shared=False, total=1842540560384
            ),
            "proxy-seeds": Storage(
                "proxy-seeds",
                "dir",
                ("iso",),
                shared=False,
                total=16 * GIB,
                base_used=2 * 1024**2,
                path="/mnt/pve/proxy-seeds",
            ),
            "vmstore": shared,
        }
        storages["local"].volumes["iso/debian-13.1.0-amd64-netinst.iso"] = Volume(
            "iso/debian-13.1.0-amd64-netinst.iso", "iso", "iso", 784334848, wall - 86400 * 40
        )
        cluster.nodes[name] = Node(
            name=name,
            index=index,
            storages=storages,
            boot_epoch=wall - uptime,
            maxcpu=maxcpu,
            maxmem=maxmem,
            ssl_fingerprint=_fingerprint(cluster),
            next_pid=0x1F0000 + cluster.rng.randrange(0x10000),
        )
    if state == "default":
        _default_guests(cluster, now)


def vm_config(
    cluster: Cluster,
    name: str,
    *,
    disk: str,
    size_gib: int,
    description: str | None = None,
    tags: str | None = None,
    agent: bool = True,
    memory: int = 1024,
    cores: int = 1,
    ctime: int,
) -> dict[str, Any]:
    """A config shaped like qemu-server writes one for a Debian cloud image VM."""
    config: dict[str, Any] = {
        "boot": "order=scsi0",
        "cores": cores,
        "cpu": "x86-64-v2-AES",
        "memory": str(memory),
        "meta": f"creation-qemu=10.1.2,ctime={ctime}",
        "name": name,
        "net0": f"virtio={random_mac(cluster.rng)},bridge=vmbr0",
        "numa": 0,
        "ostype": "l26",
        "scsi0": f"{disk},discard=on,iothread=1,size={size_gib}G,ssd=1",
        "scsihw": "virtio-scsi-single",
        "serial0": "socket",
        "smbios1": f"uuid={_uuid(cluster)}",
        "sockets": 1,
        "vga": "serial0",
        "vmgenid": _uuid(cluster),
    }
    if agent:
        config["agent"] = "1"
    if description is not None:
        config["description"] = description
    if tags:
        config["tags"] = tags
    return config


def add_vm(
    cluster: Cluster,
    vmid: int,
    name: str,
    node: str,
    *,
    storage: str = "local-lvm",
    size_gib: int = 8,
    running: bool = False,
    now: float,
    uptime: float = 0.0,
    agent_baked: bool = True,
    template: bool = False,
    **config_args: Any,
) -> Guest:
    """A VM with its disk volume, as if created long ago."""
    wall = cluster.wall(now)
    store = cluster.nodes[node].storages[storage]
    volname = f"{'base' if template else 'vm'}-{vmid}-disk-0"
    store.volumes[volname] = Volume(
        volname, "images", "raw", size_gib * GIB, wall - 86400 * 30, vmid=vmid
    )
    config = vm_config(
        cluster,
        name,
        disk=store.volid(volname),
        size_gib=size_gib,
        ctime=wall - 86400 * 30,
        **config_args,
    )
    if template:
        config["template"] = 1
    guest = Guest(
        vmid=vmid,
        node=node,
        kind="qemu",
        config=config,
        agent_baked=agent_baked,
        created_at=now - 86400 * 30,
    )
    if running:
        guest.status = "running"
        guest.qmpstatus = "running"
        guest.booted_at = now - uptime
        guest.pid = 2000000 + vmid
    cluster.add_guest(guest)
    return guest


def _default_guests(cluster: Cluster, now: float) -> None:
    wall = cluster.wall(now)
    add_vm(
        cluster,
        9000,
        "debian-13",
        "pve1",
        storage="vmstore",
        size_gib=3,
        template=True,
        now=now,
        description="Debian 13 proxy base image.\nBuilt by packer, ships qemu-guest-agent.",
        tags="debian;template",
    )
    add_vm(
        cluster,
        9001,
        "debian-13-noagent",
        "pve1",
        storage="vmstore",
        size_gib=3,
        template=True,
        agent_baked=False,
        now=now,
        description="Debian 13 generic cloud image (no guest agent).",
        tags="debian;template",
    )
    cloudinit = add_vm(
        cluster,
        9002,
        "debian-13-cloudinit",
        "pve1",
        storage="vmstore",
        size_gib=3,
        template=True,
        now=now,
        description="Debian 13 with a Proxmox cloud-init drive.",
        tags="debian;template",
    )
    cluster.nodes["pve1"].storages["vmstore"].volumes["vm-9002-cloudinit"] = Volume(
        "vm-9002-cloudinit", "images", "raw", 4 * 1024**2, wall - 86400 * 30, vmid=9002
    )
    cloudinit.config["ide2"] = "vmstore:vm-9002-cloudinit,media=cdrom"
    cloudinit.config["ipconfig0"] = "ip=dhcp"
    add_vm(
        cluster,
        100,
        "web-1",
        "pve1",
        size_gib=10,
        running=True,
        uptime=296059,
        now=now,
        memory=2048,
        cores=2,
        tags="web",
    )
    add_vm(cluster, 101, "proxy-legacy", "pve2", size_gib=8, now=now, tags="proxy")
    add_vm(
        cluster,
        102,
        "proxy-other",
        "pve3",
        storage="vmstore",
        size_gib=3,
        running=True,
        uptime=86400,
        now=now,
        description=(
            "proxyhub-managed=true\n"
            f"proxyhub-uid={OTHER_INSTALLATION_UID}\n"
            "proxyhub-created-at=2026-01-05T10:00:00Z\n"
            "proxyhub-installation=other-install"
        ),
        tags="proxyhub",
    )
    _add_container(cluster, now)


def _add_container(cluster: Cluster, now: float) -> None:
    wall = cluster.wall(now)
    store = cluster.nodes["pve2"].storages["local-lvm"]
    store.volumes["vm-200-disk-0"] = Volume(
        "vm-200-disk-0", "rootdir", "raw", 8 * GIB, wall - 86400 * 60, vmid=200
    )
    config: dict[str, Any] = {
        "arch": "amd64",
        "cores": 1,
        "description": "internal DNS cache",
        "features": "nesting=1",
        "hostname": "ct-dns",
        "memory": 512,
        "net0": f"name=eth0,bridge=vmbr0,firewall=1,hwaddr={random_mac(cluster.rng)},"
        "ip=dhcp,type=veth",
        "onboot": 1,
        "ostype": "debian",
        "rootfs": "local-lvm:vm-200-disk-0,size=8G",
        "swap": 512,
        "tags": "infra",
        "unprivileged": 1,
    }
    guest = Guest(
        vmid=200,
        node="pve2",
        kind="lxc",
        config=config,
        status="running",
        qmpstatus="running",
        booted_at=now - 1036800,
        pid=30211,
        created_at=now - 86400 * 60,
    )
    cluster.add_guest(guest)
