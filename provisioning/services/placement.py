"""Where a proxy without a zone goes (DESIGN.md §4; health-aware placement builds on this).

A blank zone on a one-node cluster is that node (seed 000 entry 3). On a larger cluster the
node with the fewest proxies of ours wins, ties broken by config order, so a fleet spreads
evenly and the choice is deterministic.
"""

from __future__ import annotations

from django.db.models import Count

from provisioning.models import Cluster, Proxy
from provisioning.models.choices import DesiredState
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.errors import PermanentError


def choose_node(cluster: Cluster, config: ProxmoxConfig) -> str:
    nodes = list(config.nodes)
    if not nodes:
        raise PermanentError(
            f"cluster {cluster.name} has no nodes",
            remediation="add the cluster's nodes to the catalogue",
        )
    if len(nodes) == 1:
        return nodes[0]
    counts = dict(
        Proxy.objects.filter(cluster=cluster, desired_state=DesiredState.PRESENT)
        .exclude(node="")
        .values_list("node")
        .annotate(n=Count("pk"))
        .values_list("node", "n")
    )
    return min(nodes, key=lambda n: (counts.get(n, 0), nodes.index(n)))
