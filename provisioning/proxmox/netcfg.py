"""Rewriting the cloned NIC for the configured bridge and VLAN (seed 000 entry 7).

The clone copies the template's ``net0``. Only when the cluster sets ``bridge`` or ``vlanTag``
is it rewritten, and then minimally: every option keeps its place, the model and its MAC stay
as cloned (a new MAC would give the guest a new DHCP lease and a new identity), and only
``bridge=`` and ``tag=`` are replaced in place, or appended when the template lacks them.
"""

from __future__ import annotations

VLAN_TAG_MIN = 1
VLAN_TAG_MAX = 4094


def rewrite_net0(value: str, *, bridge: str | None, vlan_tag: int | None) -> str:
    """``value`` with ``bridge=`` and ``tag=`` set as configured; unchanged when neither is.

    ``value`` is a ``netN`` property string (pve-reference §5.3), e.g.
    ``virtio=BC:24:11:D2:47:9A,bridge=vmbr0,firewall=1``.
    """
    if bridge is None and vlan_tag is None:
        return value
    if vlan_tag is not None and not VLAN_TAG_MIN <= vlan_tag <= VLAN_TAG_MAX:
        raise ValueError(f"vlan_tag must be {VLAN_TAG_MIN} to {VLAN_TAG_MAX}, got {vlan_tag}")
    if bridge is not None and (not bridge or "," in bridge or "=" in bridge):
        # A comma or '=' would inject options into the property string.
        raise ValueError("bridge must be a non-empty name without ',' or '='")

    wanted: dict[str, str] = {}
    if bridge is not None:
        wanted["bridge"] = bridge
    if vlan_tag is not None:
        wanted["tag"] = str(vlan_tag)

    options = value.split(",") if value else []
    for index, option in enumerate(options):
        key, sep, _ = option.partition("=")
        key = key.strip()
        if sep and key in wanted:
            options[index] = f"{key}={wanted.pop(key)}"
    options.extend(f"{key}={val}" for key, val in wanted.items())
    return ",".join(options)


# pve-reference §5.3: the MAC follows the model key (``virtio=BC:24:...``) or is ``macaddr=``.
_NIC_MODELS = frozenset(
    {
        "e1000",
        "e1000-82540em",
        "e1000-82544gc",
        "e1000-82545em",
        "e1000e",
        "i82551",
        "i82557b",
        "i82559er",
        "ne2k_isa",
        "ne2k_pci",
        "pcnet",
        "rtl8139",
        "virtio",
        "vmxnet3",
    }
)


def net0_mac(value: object) -> str | None:
    """The MAC of a ``netN`` property string, lower-case as the guest agent reports it
    (pve-reference §7.19), or None when there is none to read."""
    if not isinstance(value, str):
        return None
    for option in value.split(","):
        key, sep, val = option.partition("=")
        key = key.strip()
        if sep and (key == "macaddr" or key in _NIC_MODELS) and val.strip():
            return val.strip().lower()
    return None


def net0_option(value: object, key: str) -> str:
    """One option of a ``netN`` property string (``bridge``, ``tag``), ``""`` when absent."""
    if not isinstance(value, str):
        return ""
    for option in value.split(","):
        name, sep, val = option.partition("=")
        if sep and name.strip() == key:
            return val.strip()
    return ""


def with_mac(value: str, mac: str) -> str:
    """``value`` with its MAC set to ``mac``, in place (the model's ``<model>=<MAC>`` or
    ``macaddr=``), every other option kept; upper-case as Proxmox prints it (§5.3)."""
    options = value.split(",") if value else []
    for index, option in enumerate(options):
        key, sep, _ = option.partition("=")
        key = key.strip()
        if sep and (key == "macaddr" or key in _NIC_MODELS):
            options[index] = f"{key}={mac.upper()}"
            return ",".join(options)
    return ",".join([*options, f"macaddr={mac.upper()}"])
