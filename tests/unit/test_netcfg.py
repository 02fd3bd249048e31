"""Seed 000 entry 7: the cloned NIC gets the configured bridge and VLAN, nothing else changes."""

from __future__ import annotations

import pytest

from provisioning.proxmox.netcfg import rewrite_net0

MAC = "virtio=BC:24:11:D2:47:9A"


@pytest.mark.parametrize(
    ("value", "bridge", "vlan_tag", "expected"),
    [
        # Neither set: left exactly as cloned.
        (f"{MAC},bridge=vmbr0,firewall=1", None, None, f"{MAC},bridge=vmbr0,firewall=1"),
        # A tag is appended when the template has none; model, MAC and order stay.
        (f"{MAC},bridge=vmbr0,firewall=1", None, 4, f"{MAC},bridge=vmbr0,firewall=1,tag=4"),
        # A tag is replaced in place.
        (
            f"{MAC},bridge=vmbr0,firewall=1,tag=20,mtu=1400",
            None,
            4,
            f"{MAC},bridge=vmbr0,firewall=1,tag=4,mtu=1400",
        ),
        # A bridge is replaced in place.
        (f"{MAC},bridge=vmbr0,firewall=1", "vmbr1", None, f"{MAC},bridge=vmbr1,firewall=1"),
        # Both: each in its place, or appended bridge first.
        (f"{MAC},firewall=1,tag=7", "vmbr2", 8, f"{MAC},firewall=1,tag=8,bridge=vmbr2"),
        (f"{MAC}", "vmbr2", 8, f"{MAC},bridge=vmbr2,tag=8"),
        # The long form of model and MAC is untouched too.
        (
            "model=e1000,macaddr=BC:24:11:00:00:01,bridge=vmbr0",
            "vmbr9",
            None,
            "model=e1000,macaddr=BC:24:11:00:00:01,bridge=vmbr9",
        ),
        # `trunks` holds VLANs too but is not `tag`.
        (f"{MAC},bridge=vmbr0,trunks=10;20", None, 30, f"{MAC},bridge=vmbr0,trunks=10;20,tag=30"),
        # Setting the value it already has changes nothing.
        (f"{MAC},bridge=vmbr0,tag=4", "vmbr0", 4, f"{MAC},bridge=vmbr0,tag=4"),
    ],
)
def test_rewrite_net0_table(
    value: str, bridge: str | None, vlan_tag: int | None, expected: str
) -> None:
    assert rewrite_net0(value, bridge=bridge, vlan_tag=vlan_tag) == expected


@pytest.mark.parametrize(
    ("bridge", "vlan_tag"), [(None, 0), (None, 4095), ("", None), ("vmbr0,tag=9", None)]
)
def test_rewrite_net0_refuses_values_proxmox_would_refuse(
    bridge: str | None, vlan_tag: int | None
) -> None:
    with pytest.raises(ValueError):
        rewrite_net0(f"{MAC},bridge=vmbr0", bridge=bridge, vlan_tag=vlan_tag)
