"""Where a proxy without a zone goes (DESIGN.md §4, seed 000 entry 3, issue 6).

Without node health (no health source registered, or no fresh result for any node of the
cluster) the choice is the one that needs nothing but the database: a one-node cluster's node
(entry 3), else the node with the fewest proxies of ours, ties broken by config order, so a
fleet spreads evenly and deterministically.

With node health, no new VM goes to a node that is not ready: the proxy goes to the ready node
with the most free memory, as the latest check read it from ``/nodes/{node}/status`` less the
memory of our proxies placed there that the check could not have seen yet (their VM was not
observed as created before the check). When no node is ready the create fails transiently and
retries, so it proceeds once a check finds a node ready again.

``provisioning`` does not import ``healthchecks`` (DESIGN.md §3): the health app registers a
source with ``register_node_health`` when Django starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Q

from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import ACTIVE_STATES, DesiredState, OperationKind
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.errors import PermanentError, TransientError
from provisioning.proxmox.node_choice import NodeLoad, PlacementInputs, pick_node
from provisioning.proxmox.placement import resolve_zone

from .maintenance import nodes_paused

MIB = 1024**2


@dataclass(frozen=True)
class NodeHealthView:
    """What placement needs to know of a node's latest health check."""

    ready: bool
    reason: str
    checked_at: datetime
    mem_free_bytes: int | None = None


# cluster -> {node: its latest fresh result}; empty when nothing fresh is known.
NodeHealthSource = Callable[[Cluster], Mapping[str, NodeHealthView]]

_sources_lock = threading.Lock()
_sources: list[NodeHealthSource] = []


def register_node_health(source: NodeHealthSource) -> None:
    """Make placement health-aware; registering the same source twice is a no-op."""
    with _sources_lock:
        if source not in _sources:
            _sources.append(source)


def choose_node(cluster: Cluster, config: ProxmoxConfig) -> str:
    nodes = list(config.nodes)
    if not nodes:
        raise PermanentError(
            f"cluster {cluster.name} has no nodes",
            remediation="add the cluster's nodes to the catalogue",
        )
    if len(nodes) > 1 and getattr(settings, "PROXYHUB_ZONE_REQUIRED", False):
        # The seed's rule (entry 3), for a proxy declared before the setting was turned on.
        resolve_zone(config, "")
    return place(cluster, placement_inputs(cluster, config))


def place(cluster: Cluster, inputs: PlacementInputs) -> str:
    """The node ``pick_node`` chooses from ``inputs``; a transient refusal when fresh health
    says no node is ready (the create retries and proceeds once one is)."""
    node = pick_node(inputs)
    if node is None:
        raise TransientError(
            f"no node of cluster {cluster.name} is ready: " + inputs.not_ready_reasons(),
            remediation="see the cluster's node health results; the create retries and "
            "proceeds once a check finds a node ready",
            op="create",
        )
    return node


def placement_inputs(cluster: Cluster, config: ProxmoxConfig) -> PlacementInputs:
    """Everything placement reads about ``cluster``'s nodes, in a fixed number of queries
    however many proxies are placed from it (issue 14: read once per preview)."""
    # Issue 14: a node in maintenance takes no new VM while another node can; when every node
    # is in maintenance the choice stands and the create's next write waits for the switch.
    # Read here, the switch is one of the inputs a confirmed plan is bound to.
    _, paused = nodes_paused(cluster.pk)
    nodes = [node for node in config.nodes if node not in paused] or list(config.nodes)
    health = _node_health(cluster)
    if len(nodes) == 1 and not health:
        # The only node, nothing known of it: nothing to rank, nothing more to read.
        return PlacementInputs(cluster=cluster.name, loads=(NodeLoad(node=nodes[0]),))
    counts = _counts(cluster, nodes)
    placing = creates_in_flight(cluster, nodes)
    reserved = _unseen_memory(cluster, config, nodes, health)
    loads = []
    for node in nodes:
        view = health.get(node)
        free = view.mem_free_bytes if view is not None else None
        loads.append(
            NodeLoad(
                node=node,
                proxies=counts.get(node, 0),
                in_flight=placing[node],
                checked=view is not None,
                ready=view.ready if view is not None else True,
                reason=view.reason if view is not None else "",
                mem_left_bytes=(free - reserved[node]) if free is not None else None,
            )
        )
    return PlacementInputs(cluster=cluster.name, loads=tuple(loads))


def assert_node_ready(cluster: Cluster, node: str) -> None:
    """Refuse (for now) a node that fresh health results say is not ready; unknown is fine."""
    view = _node_health(cluster).get(node)
    if view is not None and not view.ready:
        raise TransientError(
            f"node {node} of cluster {cluster.name} is not ready ({view.reason})",
            remediation="the create waits until a health check finds the node ready; pick "
            "another zone to place it elsewhere",
            op="create",
        )


def _node_health(cluster: Cluster) -> dict[str, NodeHealthView]:
    with _sources_lock:
        sources = list(_sources)
    merged: dict[str, NodeHealthView] = {}
    for source in sources:
        merged.update(source(cluster))
    return merged


def _present(cluster: Cluster, nodes: list[str]) -> Q:
    return Q(cluster=cluster, desired_state=DesiredState.PRESENT, node__in=nodes)


def _counts(cluster: Cluster, nodes: list[str]) -> dict[str, int]:
    return dict(
        Proxy.objects.filter(_present(cluster, nodes))
        .values_list("node")
        .annotate(n=Count("pk"))
        .values_list("node", "n")
    )


def _unseen_memory(
    cluster: Cluster,
    config: ProxmoxConfig,
    nodes: list[str],
    health: Mapping[str, NodeHealthView],
) -> dict[str, int]:
    """Per checked node, the memory of our VMs its check could not have seen.

    A VM not observed as created before the node's check will take its machine type's memory
    there; without counting it, every create between two checks would pile onto the same node.
    """
    reserved = dict.fromkeys(nodes, 0)
    checked = [node for node in nodes if node in health]
    if not checked:
        return reserved
    oldest_check = min(health[node].checked_at for node in checked)
    unseen = (
        Proxy.objects.filter(_present(cluster, checked))
        .filter(Q(vm_created_at__isnull=True) | Q(vm_created_at__gt=oldest_check))
        .values_list("node", "machine_type", "vm_created_at")
    )
    for node, machine_type, created in unseen:
        if created is None or created > health[node].checked_at:
            machine = config.machine_types.get(machine_type)
            reserved[node] += (machine.memory_mib if machine is not None else 0) * MIB
    return reserved


def creates_in_flight(cluster: Cluster, nodes: list[str]) -> dict[str, int]:
    """Per node, the creates (and replaces) placed there that have not ended: their VMs are
    still being built, so neither the node's memory nor its task queue shows all of them yet.

    Placing by free memory alone sent a burst of separate creates to the node with the most
    (each saw the same reading); ranking by this count first spreads them one by one exactly
    as a bulk create spreads, and memory then decides between equally busy nodes."""
    placing = dict.fromkeys(nodes, 0)
    zones = Operation.objects.filter(
        cluster=cluster,
        kind__in=(OperationKind.CREATE, OperationKind.REPLACE),
        state__in=ACTIVE_STATES,
    ).values_list("progress__zone", flat=True)
    for zone in zones:
        if zone in placing:
            placing[zone] += 1
    return placing
