"""Which node a proxy without a zone goes to, from inputs read once (DESIGN.md §4, issue 14).

``services.placement`` reads the inputs (our proxies per node, the creates in flight per node,
the latest fresh health results) in a fixed handful of queries and hands them here. Ranking
them is plain Python, so a bulk preview places its N proxies one after another on the same
inputs, each counted in flight where it went, instead of asking the database N times (a
500-proxy preview cost 1,508 queries that way), and so the plan set can hash exactly what
placement read (``plan_set``).

The rules are placement's (see ``services/placement.py``): without health for any node, the
fewest creates in flight, then the fewest proxies, then config order; with health, only ready
nodes, ranked by in-flight creates, then memory left (free less what our unseen VMs will
take), then proxies, then config order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class NodeLoad:
    """What placement knows of one node. ``checked`` is False when no fresh health result
    exists for it; ``mem_left_bytes`` is None when the check did not read the memory."""

    node: str
    proxies: int = 0
    in_flight: int = 0
    checked: bool = False
    ready: bool = True
    reason: str = ""
    mem_left_bytes: int | None = None


@dataclass(frozen=True)
class PlacementInputs:
    """A cluster's nodes, in config order, with their loads."""

    cluster: str
    loads: tuple[NodeLoad, ...]

    def load(self, node: str) -> NodeLoad | None:
        return next((load for load in self.loads if load.node == node), None)

    def with_placed(self, node: str, memory_bytes: int) -> PlacementInputs:
        """The inputs once a create is placed on ``node``: one more in flight there, and its
        memory taken from what is left."""
        loads = tuple(
            replace(
                load,
                in_flight=load.in_flight + 1,
                mem_left_bytes=(
                    load.mem_left_bytes - memory_bytes if load.mem_left_bytes is not None else None
                ),
            )
            if load.node == node
            else load
            for load in self.loads
        )
        return replace(self, loads=loads)

    def not_ready_reasons(self) -> str:
        return ", ".join(
            f"{load.node} {load.reason}" if load.checked else f"{load.node} not checked yet"
            for load in self.loads
        )


def pick_node(inputs: PlacementInputs) -> str | None:
    """The node placement picks, or None when fresh health says no node is ready."""
    loads = list(inputs.loads)
    if not loads:
        return None
    if not any(load.checked for load in loads):
        if len(loads) == 1:
            return loads[0].node
        return min(loads, key=lambda n: (n.in_flight, n.proxies, loads.index(n))).node
    ready = [load for load in loads if load.checked and load.ready]
    if not ready:
        return None
    if len(ready) == 1:
        return ready[0].node

    def rank(load: NodeLoad) -> tuple[bool, int, int, int, int]:
        left = load.mem_left_bytes if load.mem_left_bytes is not None else 0
        return (
            load.mem_left_bytes is None,
            load.in_flight,
            -left,
            load.proxies,
            ready.index(load),
        )

    return min(ready, key=rank).node
