"""Node health at /metrics, read from the latest results when Prometheus scrapes.

The rows are the truth every process shares (the checks run in workers, /metrics is served by
the web), so nothing is kept in process memory. Families, per configured node:

* ``proxyhub_node_ready{cluster,node}``: 1 when the latest check found the node ready;
* ``proxyhub_node_check_reason{cluster,node,reason}``: 1 for the latest check's reason;
* ``proxyhub_node_check_duration_seconds{cluster,node}``: how long that check took;
* ``proxyhub_node_check_timestamp_seconds{cluster,node}``: when it ran, so an alert can tell
  a node that stopped being checked from one that is fine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .services import latest_configured

log = logging.getLogger(__name__)


class NodeHealthCollector(Collector):
    """Gauges from the latest node health results; nothing while the table is not migrated."""

    def collect(self) -> Iterator[Metric]:
        try:
            rows = list(
                latest_configured().values_list(
                    "cluster__name", "node", "ready", "reason", "duration", "checked_at"
                )
            )
        except DatabaseError as exc:
            log.debug("node health metrics skipped", extra={"reason": repr(exc)})
            return
        labels = ["cluster", "node"]
        ready = GaugeMetricFamily(
            "proxyhub_node_ready",
            "1 when the node's latest health check found it ready.",
            labels=labels,
        )
        reason = GaugeMetricFamily(
            "proxyhub_node_check_reason",
            "The reason of the node's latest health check (always 1).",
            labels=[*labels, "reason"],
        )
        duration = GaugeMetricFamily(
            "proxyhub_node_check_duration_seconds",
            "How long the node's latest health check took.",
            labels=labels,
        )
        checked = GaugeMetricFamily(
            "proxyhub_node_check_timestamp_seconds",
            "When the node's latest health check ran (Unix time).",
            labels=labels,
        )
        for cluster, node, is_ready, why, seconds, checked_at in rows:
            ready.add_metric([cluster, node], 1.0 if is_ready else 0.0)
            reason.add_metric([cluster, node, why], 1.0)
            duration.add_metric([cluster, node], float(seconds))
            checked.add_metric([cluster, node], checked_at.timestamp())
        yield from (ready, reason, duration, checked)
