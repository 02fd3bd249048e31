"""A proxy's placement resolved against its cluster's configuration (seed 000 entry 3).

Zone, machine type and image are catalogue keys, checked before any Proxmox call: an unknown
key is a ``PermanentError`` that names what the cluster offers, so an operator fixes the
proxy, or the catalogue, in one pass. The create, the plan preview and the service's field
checks all resolve through these functions, so they refuse the same keys with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import MachineType, ProxmoxConfig
from .errors import PermanentError


def resolve_zone(config: ProxmoxConfig, zone: str | None) -> str:
    """The node a proxy is placed on.

    Required only when the cluster has more than one node; with one node a blank zone selects
    it. Checked before any Proxmox call, so a typo fails fast and permanently.
    """
    nodes = ", ".join(config.nodes)
    if not zone:
        if len(config.nodes) == 1:
            return config.nodes[0]
        if not config.nodes:
            raise PermanentError(
                f"cluster {config.name} has no nodes", remediation="add a node to the cluster"
            )
        raise PermanentError(
            f"placement.zone is required: cluster {config.name} has more than one node",
            remediation=f"set the proxy's zone to one of: {nodes}",
        )
    if zone not in config.nodes:
        raise PermanentError(
            f'placement.zone "{zone}" is not in proxmox.nodes',
            remediation=f"cluster {config.name} has the nodes: {nodes or 'none'}; pick one "
            "or add the node to the cluster",
        )
    return zone


def resolve_machine_type(config: ProxmoxConfig, key: str) -> MachineType:
    """The catalogue size named by ``placement.machineType``."""
    found = config.machine_types.get(key) if key else None
    if found is None:
        raise PermanentError(
            f'placement.machineType "{key}" is not in proxmox.machineTypes',
            remediation=_pick_or_add(config, "machine types", config.machine_types, key),
        )
    return found


def resolve_template(config: ProxmoxConfig, key: str, node: str = "") -> int:
    """The template VMID named by ``placement.image``: its copy on ``node`` when the catalogue
    has one (``templates build --all-nodes``), else the template itself."""
    found = config.templates.get(key) if key else None
    if found is None:
        raise PermanentError(
            f'placement.image "{key}" is not in proxmox.templates',
            remediation=_pick_or_add(config, "templates", config.templates, key),
        )
    return found.vmid_on(node)


def _pick_or_add(config: ProxmoxConfig, what: str, offered: Mapping[str, object], key: str) -> str:
    names = ", ".join(offered) or "none"
    text = f"cluster {config.name} has the {what}: {names}; pick one"
    return f'{text} or add "{key}" to its {what}' if key else text
