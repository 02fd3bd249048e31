"""The Proxmox provider: seed 000's Create, Get, Delete, ListByTag and Check, in one place.

Two ways to drive create and delete:

* step by step (``create_step`` / ``delete_step``): what proxyhub's Celery tasks do, so no worker
  slot is held while Proxmox works; the caller persists each ``StepResult.progress``;
* blocking (``create`` / ``delete``): the same machine driven with sleeps, for commands, tests
  and anyone without a journal. These hold a per-name lock (entry 19) so a delete and a create
  of one VM never interleave inside one process.

Power actions (seed 001: start, graceful shutdown, reboot) are driven the same two ways
(``power_step`` / ``power``), with ``inspect_power`` for the confirmation page.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from .api import Api
from .boot import observe_boot
from .budgets import Budgets
from .checker import NodeCheck
from .checker import check as check_nodes
from .config import ProxmoxConfig
from .create import CreateMachine, CreateRequest
from .create import new_progress as new_create_progress
from .deadline import Cancelled, Deadline, DeadlineExceeded, effective
from .delete import DeleteMachine, DeleteRequest
from .delete import new_progress as new_delete_progress
from .errors import ProxmoxError, classify
from .identity import Identity
from .ids import parse_provider_id
from .inventory import INVENTORY_LIMIT, Inventory, Remembered, read_inventory
from .observe import (
    Instance,
    ManagedVM,
    SeedVolume,
    get,
    list_managed,
    list_seeds,
    orphan_seeds,
)
from .power import PowerMachine
from .power import new_progress as new_power_progress
from .power_checks import PowerPreview, PowerRequest, inspect_power
from .readiness import CloudInitStatus, cloud_init_status
from .release import ReleaseMachine, ReleaseRequest
from .release import new_progress as new_release_progress
from .repair import RepairMachine, RepairRequest
from .repair import new_progress as new_repair_progress
from .steps import Progress, StepMachine, StepResult
from .task_board import TaskBoard
from .template_build import TemplateBuildMachine, TemplateBuildRequest
from .template_build import new_progress as new_build_progress
from .waits import Durations, NoDurations

# Any step machine: each is built the same way (``steps.StepMachine``).
_M = TypeVar("_M", bound=StepMachine[Any])


class Provider:
    """Seed 000's provider over one ``Api`` and one cluster's ``ProxmoxConfig``."""

    def __init__(
        self,
        api: Api,
        config: ProxmoxConfig,
        *,
        budgets: Budgets | None = None,
        clock: Callable[[], float] = time.time,
        durations: Durations | None = None,
        board: TaskBoard | None = None,
    ) -> None:
        """``durations`` are the expected task durations every task wait is planned from
        (``waits``); without them each wait starts short and grows. ``board``: where every
        poll reads its task, so that one look answers for all of ours on a node
        (``task_board``); without it each task is read alone."""
        self.api = api
        self.config = config
        self.budgets = budgets or Budgets()
        self.durations: Durations = durations or NoDurations()
        known = self.durations

        def built(machine: type[_M]) -> _M:
            return machine(api, config, self.budgets, clock=clock, durations=known, board=board)

        self._create = built(CreateMachine)
        self._delete = built(DeleteMachine)
        self._power = built(PowerMachine)
        self._release = built(ReleaseMachine)
        self._repair = built(RepairMachine)
        self._build = built(TemplateBuildMachine)
        self._locks = _KeyedLock()

    # --- create -----------------------------------------------------------------------

    @staticmethod
    def new_create_progress() -> Progress:
        return new_create_progress()

    def create_step(
        self,
        req: CreateRequest,
        progress: Progress,
        *,
        deadline: Deadline | None = None,
        may_follow: Callable[[Progress], bool] | None = None,
    ) -> StepResult:
        """One step of a create; ``may_follow``: ``StepMachine.step``'s."""
        return self._create.step(req, progress, deadline=deadline, may_follow=may_follow)

    def create(self, req: CreateRequest, *, deadline: Deadline | None = None) -> str:
        """Create (or adopt) the VM and return its provider id once it runs (entry 10)."""
        with self._locks.hold(req.vm_name, deadline):
            result = self._drive(
                lambda p: self.create_step(req, p, deadline=deadline),
                new_create_progress(),
                deadline,
                "create",
            )
        assert result.provider_id is not None
        return result.provider_id

    # --- delete -----------------------------------------------------------------------

    @staticmethod
    def new_delete_progress() -> Progress:
        return new_delete_progress()

    def delete_step(
        self, req: DeleteRequest, progress: Progress, *, deadline: Deadline | None = None
    ) -> StepResult:
        return self._delete.step(req, progress, deadline=deadline)

    def delete(self, provider_id: str, *, uid: str = "", deadline: Deadline | None = None) -> None:
        """Delete the VM, its disks and its seed ISO (entry 11). Succeeds when already gone."""
        req = DeleteRequest.from_provider_id(provider_id, uid)  # malformed: PermanentError
        with self._locks.hold(req.vm_name, deadline):
            self._drive(
                lambda p: self.delete_step(req, p, deadline=deadline),
                new_delete_progress(),
                deadline,
                "delete",
            )

    # --- the seed after boot (issue 11) -------------------------------------------------

    @staticmethod
    def new_release_progress() -> Progress:
        return new_release_progress()

    def release_seed_step(
        self, req: ReleaseRequest, progress: Progress, *, deadline: Deadline | None = None
    ) -> StepResult:
        """Eject the seed from a booted VM of ours and remove it from storage (``release``)."""
        return self._release.step(req, progress, deadline=deadline)

    # --- drift repair (issue 14) --------------------------------------------------------

    @staticmethod
    def new_repair_progress() -> Progress:
        return new_repair_progress()

    def repair_step(
        self, req: RepairRequest, progress: Progress, *, deadline: Deadline | None = None
    ) -> StepResult:
        return self._repair.step(req, progress, deadline=deadline)

    # --- template builds (issue 14) ---------------------------------------------------

    @staticmethod
    def new_template_build_progress() -> Progress:
        return new_build_progress()

    def template_build_step(
        self, req: TemplateBuildRequest, progress: Progress, *, deadline: Deadline | None = None
    ) -> StepResult:
        """One stage of a template build (``template_build``)."""
        return self._build.step(req, progress, deadline=deadline)

    # --- power (seed 001) --------------------------------------------------------------

    @staticmethod
    def new_power_progress() -> Progress:
        return new_power_progress()

    def power_step(
        self, req: PowerRequest, progress: Progress, *, deadline: Deadline | None = None
    ) -> StepResult:
        return self._power.step(req, progress, deadline=deadline)

    def inspect_power(
        self,
        req: PowerRequest,
        *,
        listing: Sequence[Mapping[str, Any]] | None = None,
        deadline: Deadline | None = None,
    ) -> PowerPreview:
        """Read-only preview of ``req`` for a confirmation page: target, state, refusal, no-op."""
        return inspect_power(self.api, req, listing=listing, deadline=deadline)

    def power(self, req: PowerRequest, *, deadline: Deadline | None = None) -> StepResult:
        """Run the power action until the VM shows its outcome; the last ``StepResult`` says
        what happened (``details``: target, receipt UPID, whether it was a skipped no-op).
        A refusal raises ``PermanentError``."""
        with self._locks.hold(req.vm_name, deadline):
            return self._drive(
                lambda p: self.power_step(req, p, deadline=deadline),
                new_power_progress(),
                deadline,
                "power",
            )

    # --- reads ------------------------------------------------------------------------

    def get(
        self,
        provider_id: str,
        *,
        listing: Sequence[Mapping[str, Any]] | None = None,
        node: str | None = None,
        identity: Identity | None = None,
        deadline: Deadline | None = None,
    ) -> Instance:
        """The VM as Proxmox shows it (``observe.get``); ``identity``: the one recorded for it,
        compared with the VM's (seed 001)."""
        return get(
            self.api,
            provider_id,
            listing=listing,
            node=node,
            identity=identity,
            deadline=deadline,
        )

    def observe_boot(
        self,
        provider_id: str,
        record: Mapping[str, Any],
        *,
        uid: str,
        deadline: Deadline | None = None,
    ) -> Instance | None:
        """One agent read for a VM this create just started (``boot``); None: use ``get``."""
        return observe_boot(
            self.api,
            provider_id,
            record,
            uid=uid,
            installation=self.config.installation_id,
            deadline=deadline,
        )

    def cloud_init_status(
        self, provider_id: str, *, node: str, deadline: Deadline | None = None
    ) -> CloudInitStatus:
        """One read of cloud-init's result file in the VM (``readiness``, seed 003); a read
        that fails is classified (entry 13), like every provider call's."""
        try:
            return cloud_init_status(
                self.api, node, parse_provider_id(provider_id).vmid, deadline=deadline
            )
        except ProxmoxError as err:
            raise classify("get", err) from err

    def list_managed(
        self,
        *,
        listing: Sequence[Mapping[str, Any]] | None = None,
        skip_names: Collection[str] = frozenset(),
        deadline: Deadline | None = None,
    ) -> list[ManagedVM]:
        return list_managed(
            self.api, self.config, listing=listing, skip_names=skip_names, deadline=deadline
        )

    def list_orphan_seeds(
        self,
        *,
        listing: Sequence[Mapping[str, Any]] | None = None,
        deadline: Deadline | None = None,
    ) -> list[SeedVolume]:
        """This installation's seed ISOs on ``isoStorage`` whose VM no longer exists (DESIGN.md
        §2; ``observe.orphan_seeds``)."""
        try:
            if listing is None:
                listing = self.api.cluster_resources(deadline=deadline)
        except Exception as err:
            raise classify("list", err) from err
        return orphan_seeds(
            list_seeds(self.api, self.config, deadline=deadline),
            listing,
            installation_id=self.config.installation_id,
        )

    def inventory(
        self,
        *,
        known: Mapping[tuple[int, str], Remembered] | None = None,
        limit: int = INVENTORY_LIMIT,
        deadline: Deadline | None = None,
    ) -> Inventory:
        """Every guest of the cluster from one listing, with its owner (``inventory``)."""
        return read_inventory(
            self.api,
            installation_id=self.config.installation_id,
            known=known,
            limit=limit,
            deadline=deadline,
        )

    def check(self, *, deadline: Deadline | None = None) -> list[NodeCheck]:
        return check_nodes(self.api, self.config, deadline=deadline)

    # --- driving the machine ------------------------------------------------------------

    @staticmethod
    def _drive(
        step: Callable[[Progress], StepResult],
        progress: Progress,
        deadline: Deadline | None,
        op: str,
    ) -> StepResult:
        waiter = effective(deadline)
        while True:
            result = step(progress)
            progress = result.progress
            if result.status == "done":
                return result
            if result.status == "error":
                assert result.error is not None
                raise result.error
            if result.status == "wait":
                try:
                    waiter.sleep(result.delay)
                except (Cancelled, DeadlineExceeded) as err:
                    raise classify(op, err) from err


class _KeyedLock:
    """One slot per key, waitable with a deadline, forgotten once unused (entry 19)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str, deadline: Deadline | None) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            waiter = effective(deadline)
            while not lock.acquire(timeout=0.05):
                try:
                    waiter.check()
                except (Cancelled, DeadlineExceeded) as err:
                    raise classify("lock", err) from err
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)
