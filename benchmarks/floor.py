"""The simulator's floor for a fleet create: the least time the simulated cluster itself needs.

Each proxy's create is a chain of Proxmox tasks that must run in order, then a boot:

    clone (on the template's node) -> upload (seed ISO, on the proxy's node) -> resize ->
    start -> boot until the guest agent reports an address

``configure`` is a synchronous config write, not a task, so it adds nothing. With the
``fast`` profile (pvesim/profiles.py) that chain is
``C = clone + upload + task + start + boot`` = 0.3 + 0.1 + 0.1 + 0.1 + 0.6 = 1.2 s, where
``boot = max(agent_start, address_after)`` for a template with the agent baked in (the
catalogue's ``debian-13``) and ``address_after + agent_install`` when vendor-data installs it.

Tasks need a slot: a node runs at most ``L = node_task_limit`` tasks at once. Every clone runs on
the template's node ``T`` (the clone is submitted to the source node and targets the proxy's
node), so with ``N`` proxies of which ``N_k`` are placed on node ``k``:

    W_T = N * clone + N_T * (upload + task + start)      (work on the template's node)
    W_k = N_k * (upload + task + start)                  (work on any other node)

No schedule can beat either bound below, so the floor is their maximum:

    floor = max( C,
                 W_T / L + boot,                     the template node's work, then a boot
                 max_k (clone + W_k / L + boot) )    a node's first task waits for a clone

(whatever a node's last task is, at least a boot still follows it: after a clone, upload or
resize a start and a boot are still to come). Everything scales with ``--time-scale``. The
floor leaves out request latency and the polls needed to notice that a task ended: that is
exactly the overhead the benchmark measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pvesim.profiles import Profile, get_profile


@dataclass(frozen=True)
class Floor:
    seconds: float
    critical_path: float
    template_node_bound: float
    other_node_bound: float
    formula: str


def boot_seconds(profile: Profile, *, agent_baked: bool = True) -> float:
    """Start-task end to an address the agent reports (simulator/agent.py)."""
    if agent_baked:
        return max(profile.agent_start, profile.address_after)
    return profile.address_after + profile.agent_install


def create_stages(
    *, profile: str | Profile = "realistic", time_scale: float = 1.0, agent_baked: bool = True
) -> dict[str, float]:
    """The lone create's critical path (``create_floor``) by the journal's stage that waits on
    each part: a stage not named here (the lookup, the config write) has a floor of 0."""
    return _stages(get_profile(profile, time_scale), agent_baked=agent_baked)


def _stages(p: Profile, *, agent_baked: bool) -> dict[str, float]:
    """One create's critical path, part by part: the clone, then its node's upload, resize
    (``task``) and start, then the boot to an address."""
    return {
        "clone": p.clone,
        "upload": p.upload,
        "resize": p.task,
        "start": p.start,
        "address": boot_seconds(p, agent_baked=agent_baked),
    }


def fleet_floor(
    placement: Mapping[str, int],
    *,
    template_node: str,
    profile: str | Profile = "fast",
    time_scale: float = 1.0,
    agent_baked: bool = True,
    node_task_limit: int | None = None,
) -> Floor:
    """The floor for creating ``sum(placement.values())`` proxies placed as ``placement``;
    ``node_task_limit`` is the simulator's ``--node-task-limit`` when one was given."""
    p = get_profile(profile, time_scale)
    if node_task_limit is not None:
        p = p.with_task_limit(node_task_limit)
    boot = boot_seconds(p, agent_baked=agent_baked)
    per_node = p.upload + p.task + p.start
    n = sum(placement.values())
    limit = p.node_task_limit
    critical = sum(_stages(p, agent_baked=agent_baked).values())
    template_work = n * p.clone + placement.get(template_node, 0) * per_node
    template_bound = template_work / limit + boot
    other_bound = max(
        (
            p.clone + count * per_node / limit + boot
            for node, count in placement.items()
            if node != template_node and count
        ),
        default=0.0,
    )
    return Floor(
        seconds=max(critical, template_bound, other_bound),
        critical_path=critical,
        template_node_bound=template_bound,
        other_node_bound=other_bound,
        formula="max(C, W_T/L + boot, max_k(clone + W_k/L + boot)); see benchmarks/floor.py",
    )


def create_floor(
    *, profile: str | Profile = "realistic", time_scale: float = 1.0, agent_baked: bool = True
) -> Floor:
    """One proxy alone: its critical path ``clone + upload + resize + start + boot`` (no
    queue: one proxy never fills a node's slots)."""
    return fleet_floor(
        {"template-node": 1},
        template_node="template-node",
        profile=profile,
        time_scale=time_scale,
        agent_baked=agent_baked,
    )
