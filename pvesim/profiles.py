"""How long things take in the simulator: task durations, guest boot timing, server delays.

Three profiles, picked by name (``Engine(profile=...)``, ``pvesim --profile``):

``instant``
    Every task ends the moment it is submitted and a started guest's agent answers with its
    address at once. For unit tests: no test waits, and state still moves through the same
    task machinery (UPIDs, logs, exit statuses) as on a real node.

``fast``
    A clone takes 0.3 s, every other task 0.1 s, a baked-in agent answers 0.3 s after boot and
    the address appears after 0.6 s (1.0 s when the seed's vendor-data has to install the
    agent first). For integration tests and benchmarks: long enough that polling, locks and
    queues are really exercised, short enough to run hundreds of creates.

``realistic``
    Close to seed 000's host (pve-manager 9.2.20, one node): a full clone of the 3 GiB template
    about 2 s (seed 000 entry 4, F16), an upload 0.5 s, a start 1 s, and about 50 s from start
    to an address when vendor-data installs the agent (entry 7, F21). Every 401 is delayed by
    3 s, as pveproxy does (pve-reference §2.2).

In every profile a node runs at most ``node_task_limit`` tasks at once; further tasks wait in
a queue and read as ``running`` meanwhile (a real node has no such hard limit, but storage
locks serialise clones in practice — research/peers.md §6). ``statd_lag`` is pvestatd's
10-second pass: a guest created less than that ago is listed bare in ``/cluster/resources``
(pve-reference §7.9).

``time_scale`` multiplies every duration and delay (``Profile.scaled``); ``--node-task-limit``
replaces the profile's ``node_task_limit`` (``Profile.with_task_limit``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Profile:
    """Durations in seconds of the engine's clock."""

    name: str
    clone: float  # qmclone
    start: float  # qmstart / hastart
    upload: float  # imgcopy
    task: float  # every other task: stop, shutdown, reboot, resize, destroy, imgdel, qmconfig
    agent_start: float  # boot → an agent baked into the template answers its ping
    address_after: float  # boot → eth0 holds its DHCP IPv4
    agent_install: float  # address → vendor-data has installed and started the agent
    auth_fail_delay: float  # every 401 is answered this late
    node_task_limit: int  # tasks running at once per node; more wait in a queue
    statd_lag: float = 10.0  # pvestatd's pass: how long a new guest stays bare in resources
    # address → cloud-init's final stage wrote /run/cloud-init/result.json (seed 003 readiness)
    cloud_init: float = 0.0

    def scaled(self, factor: float) -> Profile:
        """The same profile with every duration multiplied by ``factor`` (``time_scale``)."""
        if factor < 0:
            raise ValueError("time_scale must not be negative")
        if factor == 1.0:
            return self
        return replace(
            self,
            clone=self.clone * factor,
            start=self.start * factor,
            upload=self.upload * factor,
            task=self.task * factor,
            agent_start=self.agent_start * factor,
            address_after=self.address_after * factor,
            agent_install=self.agent_install * factor,
            auth_fail_delay=self.auth_fail_delay * factor,
            statd_lag=self.statd_lag * factor,
            cloud_init=self.cloud_init * factor,
        )

    def with_task_limit(self, limit: int) -> Profile:
        """The same profile whose nodes run at most ``limit`` tasks at once."""
        if int(limit) < 1:
            raise ValueError("node_task_limit must be at least 1")
        return replace(self, node_task_limit=int(limit))

    def duration(self, task_type: str) -> float:
        """How long a task of ``task_type`` runs once it has a slot."""
        if task_type in ("qmclone", "vzclone"):
            return self.clone
        if task_type in ("qmstart", "hastart", "vzstart"):
            return self.start
        if task_type in ("imgcopy", "download"):
            return self.upload
        return self.task


PROFILES: dict[str, Profile] = {
    "instant": Profile(
        name="instant",
        clone=0.0,
        start=0.0,
        upload=0.0,
        task=0.0,
        agent_start=0.0,
        address_after=0.0,
        agent_install=0.0,
        auth_fail_delay=0.0,
        node_task_limit=4,
    ),
    "fast": Profile(
        name="fast",
        clone=0.3,
        start=0.1,
        upload=0.1,
        task=0.1,
        agent_start=0.3,
        address_after=0.6,
        agent_install=0.4,
        auth_fail_delay=0.0,
        node_task_limit=4,
        cloud_init=0.3,
    ),
    "realistic": Profile(
        name="realistic",
        clone=2.0,
        start=1.0,
        upload=0.5,
        task=1.0,
        agent_start=15.0,
        address_after=20.0,
        agent_install=30.0,
        auth_fail_delay=3.0,
        node_task_limit=4,
        cloud_init=25.0,
    ),
}


def get_profile(profile: str | Profile, time_scale: float = 1.0) -> Profile:
    """A profile by name (or as given), scaled by ``time_scale``."""
    if isinstance(profile, Profile):
        return profile.scaled(time_scale)
    try:
        base = PROFILES[profile]
    except KeyError:
        names = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown simulator profile {profile!r} (one of: {names})") from None
    return base.scaled(time_scale)
