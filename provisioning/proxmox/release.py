"""Releasing a seed ISO once the boot that needed it is over (issue 11).

The seed holds the proxy's user-data, secrets included. cloud-init reads it at the first boot;
once the guest agent has reported an address, that boot is over, so the seed is ejected from
the VM and removed from ``isoStorage`` rather than kept on storage for the VM's whole life.

Stages, each resumable from the record alone:

``eject``        read the config; when the VM is still ours (name, installation and uid in the
                 mark) and a drive holds our seed, set that drive to ``none,media=cdrom``.
                 Proxmox changes a CD-ROM's medium on a running VM at once (pve-reference
                 §7.13: "CD-ROM media (always)"); ``delete=ide2`` would stay pending until the
                 next start, so the drive keeps existing and only its medium goes. The write is
                 ensure-shaped: a retry after a lost reply reads the config first and finds the
                 drive empty, so it never writes twice.
``remove``       delete the seed volume (an ``imgdel`` task), ensure-shaped: the node's running
                 ``imgdel`` tasks and the storage are read first, every time, since a worker
                 that died after submitting leaves no record of it. An ``imgdel`` still running
                 is waited for; a seed that is gone is done; only a seed still there with
                 nothing running is deleted.
``remove_wait``  poll the ``imgdel`` task.

A VM that is not ours any more (its VMID reused, its mark changed) is left alone and its seed
kept: only the delete of a VM of ours removes what such a VM might still use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from .deadline import Deadline
from .errors import ApiError, TaskFailed
from .marks import parse_mark
from .ownership import is_missing
from .seed import seed_iso_name, seed_volid
from .steps import Progress, StepMachine, StepResult, advance, fail, warm

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "release_seed"
EMPTY_CDROM = "none,media=cdrom"


@dataclass(frozen=True)
class ReleaseRequest:
    """Whose seed to release: the VM (name, VMID, node), the proxy's uid, and the node the seed
    was uploaded to (the create's node; the VM may have moved since)."""

    vm_name: str
    uid: str
    vmid: int
    node: str
    seed_node: str


def new_progress() -> Progress:
    return {"v": 1, "stage": "eject", "upid": None, "since": None}


class ReleaseMachine(StepMachine[ReleaseRequest]):
    """Runs one stage of a seed release per call. Stateless: everything lives in the record."""

    op = OP
    first_stage = "eject"

    def volid(self, req: ReleaseRequest) -> str:
        name = seed_iso_name(req.vm_name, installation_id=self.config.installation_id, uid=req.uid)
        return seed_volid(self.config.iso_storage, name)

    def on_api_error(self, progress: Progress, stage: str, err: ApiError) -> StepResult:
        if is_missing(err) and stage == "eject":
            # The VM vanished between the read and the write: nothing holds the seed now.
            return StepResult("continue", advance(progress, "remove"), stage, message=str(err))
        return fail(progress, stage, err, op=OP)

    def on_done(self, req: ReleaseRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox seed released",
            extra={"vmid": req.vmid, "vm_name": req.vm_name, "outcome": result.message},
        )

    def _eject(
        self, req: ReleaseRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        volid = self.volid(req)
        try:
            config = self.api.vm_config(req.node, req.vmid, deadline=deadline)
        except ApiError as err:
            if not is_missing(err):
                raise
            # The VM is gone: nothing holds the seed, which is ours by its name.
            return StepResult(
                "continue", advance(progress, "remove"), "eject", message="the VM is gone"
            )
        why = self._not_ours(req, config)
        if why is not None:
            return StepResult("done", advance(progress, "done"), "eject", message=why)
        drives = {
            key: EMPTY_CDROM
            for key, value in config.items()
            if str(value).split(",", 1)[0] == volid
        }
        if not drives:
            return StepResult(
                "continue",
                advance(progress, "remove"),
                "eject",
                message="the seed is not attached",
            )
        self.api.set_vm_config(req.node, req.vmid, drives, deadline=deadline)
        return StepResult(
            "continue",
            advance(progress, "remove", ejected=True),
            "eject",
            submitted=True,
            message=f"ejected the seed from {', '.join(sorted(drives))}",
        )

    def _not_ours(self, req: ReleaseRequest, config: Mapping[str, str]) -> str | None:
        """Why the VM is left alone, or None when it is ours (as delete.py judges a destroy)."""
        mark = parse_mark(config.get("description"))
        if (
            config.get("name") == req.vm_name
            and mark.managed
            and mark.uid == req.uid
            and mark.installation == self.config.installation_id
        ):
            return None
        return f"VM {req.vmid} is not this proxy's any more; its seed is kept"

    def _remove(
        self, req: ReleaseRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        volid = self.volid(req)
        node = req.seed_node
        # Warm after an eject that found our seed attached (issue 12): this process wrote the
        # record, so no delete of ours was sent since, and the seed the VM held is there; the
        # read-back is skipped. A cold record, or an eject that found no seed attached (a release
        # run again, say), reads back first.
        known = warm(progress) and progress.get("ejected")
        settled = None if known else self._read_back(node, volid, progress, deadline)
        if settled is not None:
            return settled
        upid = self.api.delete_volume(node, self.config.iso_storage, volid, deadline=deadline)
        if upid is None:
            return StepResult("done", advance(progress, "done"), "remove", message="removed")
        return StepResult(
            "wait",
            advance(progress, "remove_wait", upid=upid, since=self.clock()),
            "remove",
            delay=self.budgets.poll_interval,
            upid=upid,
            submitted=True,
            message=f"removing {volid.split('/', 1)[-1]} on {node}",
        )

    def _read_back(
        self, node: str, volid: str, progress: Progress, deadline: Deadline | None
    ) -> StepResult | None:
        """The step that settles the removal without a delete, or None to delete. Running
        ``imgdel`` tasks are read before the storage (as create's upload read-back does): a
        task that ends between the two reads is then seen by the storage read."""
        if self.api.node_tasks(node, typefilter="imgdel", source="active", deadline=deadline):
            return StepResult(
                "wait",
                progress,
                "remove",
                delay=self.budgets.poll_interval,
                message="a volume delete is still running on the node; reading back again",
            )
        items = self.api.storage_content(
            node, self.config.iso_storage, content="iso", deadline=deadline
        )
        if not any(item.get("volid") == volid for item in items):
            return StepResult(
                "done", advance(progress, "done"), "remove", message="the seed is gone"
            )
        return None

    def _remove_wait(
        self, req: ReleaseRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        def failed(err: TaskFailed) -> StepResult:
            return fail(advance(progress, "remove"), "remove_wait", err, op=OP)

        result = self.poll(
            progress, "remove_wait", self.budgets.seed_delete, "done", deadline, failed
        )
        if result.status == "continue" and result.progress["stage"] == "done":
            return StepResult(
                "done",
                result.progress,
                "remove_wait",
                upid=result.upid,
                message="removed",
                details=result.details,  # the wait's timing, for the estimates (steps.TIMING)
            )
        return result
