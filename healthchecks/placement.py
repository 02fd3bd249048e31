"""The health source behind provisioning's placement (``register_node_health``).

``provisioning`` may not import ``healthchecks`` (DESIGN.md §3), so this app hands placement a
function when Django starts (``HealthchecksConfig.ready``). Only fresh results count: when
Beat has stopped checking, old results neither hold creates back nor steer them, and placement
falls back to spreading proxies by count.
"""

from __future__ import annotations

from django.utils import timezone

from provisioning.models import Cluster
from provisioning.services.placement import NodeHealthView

from .models import NodeHealth
from .services import stale_after


def node_health_for_placement(cluster: Cluster) -> dict[str, NodeHealthView]:
    """The fresh latest result of each node of ``cluster`` that has one."""
    fresh_since = timezone.now() - stale_after()
    rows = NodeHealth.objects.filter(
        cluster=cluster, latest=True, checked_at__gte=fresh_since
    ).order_by()
    return {
        row.node: NodeHealthView(
            ready=row.ready,
            reason=row.reason,
            checked_at=row.checked_at,
            mem_free_bytes=row.mem_free_bytes,
        )
        for row in rows.only("node", "ready", "reason", "checked_at", "details")
    }
