"""Create, as a resumable step machine: seed 000 entry 10 (with entries 2 to 8).

The stages, in order (each call runs one of them; see ``steps.StepResult``):

``lookup``      validate placement; one ``/cluster/resources`` listing; find the VM by name or
                judge the VMIDs ``vmid_for(uid, 0..31)`` (entry 2); check the template before
                allocating (entry 4)
``lock_wait``   a VMID we must judge is locked or nameless (a clone running): wait for it
``clone``       full clone with the mark in the description (entry 8)
``clone_wait``  poll the ``qmclone`` task
``upload``      build the NoCloud seed and upload it, overwriting (entry 5)
``upload_wait`` poll the ``imgcopy`` task
``configure``   one synchronous ``PUT .../config``: cores, memory, agent, tag, seed CD-ROM, net0
``resize``      grow the boot disk when the machine type asks for more (entry 6)
``resize_wait`` poll the ``resize`` task
``start``       start the VM (observed first: a running VM is not started again)
``start_wait``  read the VM's status until it runs (that look times the start); the ``qmstart``
                task is read too by every look after the first that found the VM not running.
                Beside other tasks of ours on the node, the node's task list answers instead:
                the ``qmstart``'s end is the VM running (``_start_listed``)
``running``     read ``status/current`` until the VM runs; then done

What a retry finds (entry 10's table) follows from the record: a UPID in the record is polled,
never resubmitted; a clone submitted but not recorded is found at its deterministic VMID, locked
and nameless, waited on and adopted; steps 5 to 7 repeat safely (the upload overwrites, the
config is compared before it is written, the resize is skipped once large enough).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .deadline import Deadline
from .disks import boot_disk, disk_size_bytes, gib
from .errors import ApiError, PermanentError, ReplyLost, TransientError
from .identity import Identity, check_identity, identity_of
from .ids import MAX_ATTEMPTS, format_provider_id, vmid_for
from .marks import complete_mark, render_mark
from .netcfg import net0_mac
from .ownership import Ownership, is_missing, judge, judge_config
from .placement import resolve_machine_type, resolve_template, resolve_zone
from .seed import build_seed_iso, seed_iso_name, seed_volid
from .steps import (
    Progress,
    StepMachine,
    StepResult,
    advance,
    fail,
    permanent,
    warm,
    with_timing,
)
from .task_board import Look
from .tasks import parse_upid
from .template import TEMPLATE_REMEDIATION, desired_config, template_problem
from .waits import seen_at

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "create"
# How old the lookup's listing may be for the clone to trust it instead of asking
# ``/cluster/nextid`` again (a warm record only: see ``_clone``).
LISTING_FRESH_SECONDS = 5.0


@dataclass(frozen=True)
class CreateRequest:
    """What a create needs: the proxy's identity, placement and cloud-init.

    ``vm_name`` is ``proxy-<Proxy.name>`` (DESIGN.md §2); ``cloud_init`` is the user-data,
    kept byte for byte and never logged or shown (``repr`` leaves it out). ``identity`` is the
    SMBIOS UUID and vmgenid recorded for the proxy's VM, if any (seed 001): a VM found at the
    name with another identity is not adopted.
    """

    uid: str
    vm_name: str
    machine_type: str
    image: str
    zone: str = ""
    cloud_init: bytes = field(default=b"", repr=False)
    identity: Identity = field(default_factory=Identity)


def new_progress() -> Progress:
    """The record a fresh create starts from."""
    return {"v": 1, "stage": "lookup", "vmid": None, "node": None, "upid": None, "since": None}


class CreateMachine(StepMachine[CreateRequest]):
    """Runs one stage of a create per call. Stateless: everything lives in the record."""

    op = OP
    first_stage = "lookup"
    # The config write after the seed's upload, and the resize and the start after the task
    # before them ended, all on the VM's node (issue 12: a delivery each was most of a create's
    # turnover between two tasks). The lookup and the clone are never followed: the lookup's
    # verdict commits before any clone (``_lookup``), and the upload after the clone runs on
    # another node's slot.
    follows = frozenset({"configure", "resize", "start"})

    def on_api_error(self, progress: Progress, stage: str, err: ApiError) -> StepResult:
        if is_missing(err) and stage not in ("lookup", "clone"):
            # The VM vanished between steps: start over from the lookup (entry 10:
            # "does not exist" inside create is transient, never not-found). Its identity goes
            # with it: kept, it would make the next clone at this VMID look like a VM restored
            # from a backup (seed 001) to whatever reads it before that clone is configured.
            result = fail(
                advance(progress, "lookup", smbios_uuid=None, vmgenid=None), stage, err, op=OP
            )
            result.vm_gone = True
            return result
        return fail(progress, stage, err, op=OP)

    def on_done(self, req: CreateRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox vm ensured running",
            extra={
                "vmid": progress.get("vmid"),
                "vm_name": req.vm_name,
                "node": progress.get("node"),
                "cloudInitBytes": len(req.cloud_init),
            },
        )

    def seed_name(self, req: CreateRequest) -> str:
        """This proxy's seed in this installation (issue 11: never another's)."""
        return seed_iso_name(req.vm_name, installation_id=self.config.installation_id, uid=req.uid)

    # --- lookup and allocation (entries 2, 3, 4) -----------------------------------------

    def _lookup(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node = resolve_zone(self.config, req.zone)
        machine = resolve_machine_type(self.config, req.machine_type)
        template_vmid = resolve_template(self.config, req.image, node)

        listing = self.api.cluster_resources(deadline=deadline)
        by_vmid = {int(e["vmid"]): e for e in listing if "vmid" in e}
        named = [
            e
            for e in listing
            if e.get("type") == "qemu"
            and not int(e.get("template") or 0)
            and e.get("name") == req.vm_name
        ]
        if len(named) > 1:
            vmids = ", ".join(str(e["vmid"]) for e in sorted(named, key=lambda e: int(e["vmid"])))
            return permanent(
                progress,
                "lookup",
                f"{len(named)} VMs are named {req.vm_name} (VMIDs {vmids})",
                "remove the duplicates in Proxmox so only one remains, then retry",
                OP,
            )
        if named:
            entry = named[0]
            verdict = judge(
                self.api,
                int(entry["vmid"]),
                entry,
                vm_name=req.vm_name,
                uid=req.uid,
                installation=self.config.installation_id,
                deadline=deadline,
            )
            if verdict.verdict in ("busy", "ours"):
                return self._settle(req, progress, verdict, deadline)
            # Renamed or destroyed since the listing was built: allocate as if absent.

        # A VMID recorded by an earlier round (a clone we may have submitted) is judged first:
        # a nameless, locked clone of ours must be waited on, not probed past.
        recorded = progress.get("vmid")
        if recorded is not None:
            verdict = judge(
                self.api,
                int(recorded),
                by_vmid.get(int(recorded)),
                vm_name=req.vm_name,
                uid=req.uid,
                installation=self.config.installation_id,
                deadline=deadline,
            )
            if verdict.verdict in ("busy", "ours"):
                return self._settle(req, progress, verdict, deadline)

        template_node = self._check_template(template_vmid, machine.disk_gib, by_vmid, deadline)
        first = int(progress.get("attempt") or 0) if recorded is not None else 0
        for attempt in range(first, MAX_ATTEMPTS):
            vmid = vmid_for(req.uid, attempt, self.config.vmid_min, self.config.vmid_max)
            verdict = judge(
                self.api,
                vmid,
                by_vmid.get(vmid),
                vm_name=req.vm_name,
                uid=req.uid,
                installation=self.config.installation_id,
                deadline=deadline,
            )
            if verdict.verdict == "foreign":
                continue
            if verdict.verdict == "free":
                created_at = progress.get("created_at") or _rfc3339(self.clock())
                result = StepResult(
                    "continue",
                    advance(
                        progress,
                        "clone",
                        vmid=vmid,
                        attempt=attempt,
                        node=node,
                        template_vmid=template_vmid,
                        template_node=template_node,
                        created_at=created_at,
                        listed_at=self.clock(),
                    ),
                    "lookup",
                    message=f"VMID {vmid} is free (attempt {attempt})",
                )
                # No VM of ours exists (none by name, none at a VMID this create recorded), so
                # an identity the proxy still records (seed 001) names a VM that is gone. It is
                # forgotten with this step, before the clone: kept until the clone's config is
                # read, it made that clone look restored from a backup to a replace or delete
                # asked for meanwhile (tests/service/test_identity.py).
                result.vm_gone = req.identity.known
                return result
            return self._settle(req, dict(progress, attempt=attempt), verdict, deadline)
        raise TransientError(
            f"no free VMID for {req.vm_name} after {MAX_ATTEMPTS} attempts in "
            f"{self.config.vmid_min}-{self.config.vmid_max}",
            remediation="free VMIDs in the range or widen vmidRange",
            op=OP,
        )

    def _settle(
        self,
        req: CreateRequest,
        progress: Progress,
        verdict: Ownership,
        deadline: Deadline | None,
    ) -> StepResult:
        """Act on an ownership verdict for a VMID that is not free."""
        if verdict.verdict == "busy":
            return StepResult(
                "wait",
                advance(
                    progress, "lock_wait", vmid=verdict.vmid, node=verdict.node, since=self.clock()
                ),
                "lookup",
                delay=self.budgets.poll_interval,
                message=f"VM {verdict.vmid} is locked or mid-clone; waiting for it",
            )
        if verdict.verdict == "ours":
            return self._adopt(
                req, progress, verdict.vmid, str(verdict.node), verdict.config or {}, deadline
            )
        # Only "free" and "foreign" remain, and callers handle both before getting here.
        raise TransientError(f"unexpected verdict {verdict.verdict} for VM {verdict.vmid}", op=OP)

    def _adopt(
        self,
        req: CreateRequest,
        progress: Progress,
        vmid: int,
        node: str,
        config: Mapping[str, str],
        deadline: Deadline | None,
    ) -> StepResult:
        """Our VM exists: running means done; otherwise continue at the seed upload. A mark
        without our uid (entry 2 adopts it) is completed first, so the VM is ours by its mark
        and not by its name alone.

        Seed 001: a VM whose identity is not the one recorded for the proxy is never adopted
        (``IdentityMismatch``), unless it sits at the VMID this create chose to clone onto: that
        one is the clone this create submitted (its reply lost), which no record knows yet.
        The identity found is recorded in the progress for the caller to keep."""
        own_clone = progress.get("template_vmid") is not None and progress.get("vmid") == vmid
        found = (
            identity_of(config)
            if own_clone
            else check_identity(req.identity, config, vmid=vmid, vm_name=req.vm_name, op=OP)
        )
        progress = dict(progress, smbios_uuid=found.smbios_uuid, vmgenid=found.vmgenid)
        description = complete_mark(
            config.get("description"),
            req.uid,
            self.config.installation_id,
            datetime.fromtimestamp(self.clock(), UTC),
        )
        if description is not None:
            self.api.set_vm_config(node, vmid, {"description": description}, deadline=deadline)
        status = self.api.vm_status(node, vmid, deadline=deadline)
        if status.get("status") == "running":
            done = advance(progress, "done", vmid=vmid, node=node)
            return StepResult(
                "done",
                done,
                "lookup",
                provider_id=format_provider_id(vmid, req.vm_name),
                message=f"adopted running VM {vmid}",
                details=_identity_details(done),
            )
        return StepResult(
            "continue",
            advance(progress, "upload", vmid=vmid, node=node),
            "lookup",
            message=f"adopted VM {vmid} on {node}",
        )

    def _check_template(
        self,
        template_vmid: int,
        disk_gib: int | None,
        by_vmid: Mapping[int, Mapping[str, Any]],
        deadline: Deadline | None,
    ) -> str:
        """Entry 4: refuse a template the clone could not use, before any VM exists."""
        entry = by_vmid.get(template_vmid)
        if entry is None or entry.get("type") != "qemu":
            raise PermanentError(
                f"template VM {template_vmid} does not exist in cluster {self.config.name}",
                remediation="create the template or point the catalogue's image at an existing one",
                op=OP,
            )
        node = str(entry["node"])
        config = self.api.vm_config(node, template_vmid, deadline=deadline)
        problem = template_problem(config, self.config, template_vmid, disk_gib=disk_gib)
        if problem:
            raise PermanentError(problem, remediation=TEMPLATE_REMEDIATION, op=OP)
        return node

    def _lock_wait(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        try:
            config = self.api.vm_config(node, vmid, deadline=deadline)
        except ApiError as err:
            if not is_missing(err):
                raise
            # Gone, or moved to its target node when the clone finished: look again.
            return StepResult("continue", advance(progress, "lookup"), "lock_wait")
        verdict = judge_config(
            vmid,
            node,
            config,
            vm_name=req.vm_name,
            uid=req.uid,
            installation=self.config.installation_id,
        )
        if verdict.verdict == "busy":
            since = progress.get("since") or self.clock()
            if self.clock() - since > self.budgets.lock_wait:
                raise TransientError(
                    f"VM {vmid} stayed locked for more than {int(self.budgets.lock_wait)} s",
                    remediation=f"if no task runs on it, clear the lock with `qm unlock {vmid}` "
                    "or destroy the VM",
                    op=OP,
                )
            return StepResult(
                "wait", dict(progress, since=since), "lock_wait", delay=self.budgets.poll_interval
            )
        if verdict.verdict == "ours":
            return self._adopt(req, progress, vmid, node, config, deadline)
        # Foreign now that it is unlocked: probe on from the next attempt.
        return StepResult(
            "continue",
            advance(progress, "lookup", attempt=int(progress.get("attempt") or 0) + 1),
            "lock_wait",
            message=f"VM {vmid} belongs to someone else; probing on",
        )

    # --- clone (entries 4 and 8) ------------------------------------------------------

    def _clone(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        template_node = str(progress["template_node"])
        description = render_mark(
            req.uid, _parse_rfc3339(progress["created_at"]), self.config.installation_id
        )
        if not self._listing_fresh(progress) and self._taken(vmid, deadline):
            # Taken since the listing, maybe by our own clone whose reply was lost: Proxmox's
            # own refusal only sees the template's node, and a clone that already moved to
            # another node would be accepted twice. The ownership check decides (entry 2).
            return StepResult(
                "continue",
                advance(progress, "lookup"),
                "clone",
                message=f"VMID {vmid} is taken; checking whose it is",
            )
        try:
            upid = self.api.clone(
                template_node,
                int(progress["template_vmid"]),
                newid=vmid,
                name=req.vm_name,
                description=description,
                full=True,
                storage=self.config.storage,
                target=node if node != template_node else None,
                pool=self.config.pool,  # issue 14: the pool's ACL covers the new VM
                deadline=deadline,
            )
        except ApiError as err:
            if err.status == 500 and "config file already exists" in err.message:
                # Taken between the listing and the clone, maybe by our own earlier
                # submission: the ownership check decides (entry 2).
                return StepResult(
                    "continue",
                    advance(progress, "lookup"),
                    "clone",
                    message=f"VMID {vmid} was taken; checking whose it is",
                )
            raise
        return StepResult(
            "wait",
            # The node's clock at the clone: a seed uploaded for this VM is newer than it
            # (the upload's read-back tells ours from a stale seed of an earlier proxy).
            advance(
                progress, "clone_wait", upid=upid, since=self.clock(), cloned_at=_node_time(upid)
            ),
            "clone",
            delay=self.budgets.poll_interval,
            upid=upid,
            submitted=True,
            message=f"cloning template {progress['template_vmid']} to VM {vmid}",
        )

    def _listing_fresh(self, progress: Progress) -> bool:
        """Whether the lookup's listing still vouches that the VMID is free (issue 12): the
        record is warm (this process wrote it, so no clone of ours was sent since) and the
        listing is seconds old, no older than a ``nextid`` answer would be by the time the clone
        arrives. A cold record (a resumed step, a lost reply, an older record without
        ``listed_at``) asks ``nextid`` as before."""
        listed = progress.get("listed_at")
        return (
            warm(progress)
            and isinstance(listed, int | float)
            and 0 <= self.clock() - listed <= LISTING_FRESH_SECONDS
        )

    def _taken(self, vmid: int, deadline: Deadline | None) -> bool:
        """Whether ``vmid`` is in use anywhere in the cluster (``/cluster/nextid?vmid=``)."""
        try:
            self.api.cluster_nextid(vmid=vmid, deadline=deadline)
        except ApiError as err:
            if err.status == 400 and "already exists" in " ".join(err.errors.values()):
                return True
            raise
        return False

    def _clone_wait(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        def failed(err: Exception) -> StepResult:
            # Proxmox removed the half-made VM; the next attempt starts over.
            return fail(advance(progress, "lookup"), "clone_wait", err, op=OP)

        return self.poll(progress, "clone_wait", self.budgets.clone, "upload", deadline, failed)

    # --- seed, config, resize (entries 5, 6, 7) ------------------------------------------

    def _upload(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        """Upload the seed, overwriting (entry 5). When an earlier submission's reply was lost
        (``upload_sent`` in the record), read back first: the seed on the storage with our size,
        written after this VM's clone started (the node's clock, from the clone's UPID), was
        uploaded by that submission; an ``imgcopy`` still running on the node may be it, so it
        is waited for. Only a seed that is not there is uploaded again (issue 16: never a blind
        second submission). A create that adopted its clone has no clone time: then an upload
        whose reply was lost is sent again, which overwrites with the same bytes."""
        node = str(progress["node"])
        name = self.seed_name(req)
        iso = build_seed_iso(
            user_data=req.cloud_init,
            instance_id=req.uid,
            hostname=req.vm_name,
            vendor_data=self.config.vendor_data,
            install_guest_agent=self.config.install_guest_agent,
        )
        if progress.get("upload_sent"):
            settled = self._read_back_seed(node, name, len(iso), progress, deadline)
            if settled is not None:
                return settled
        try:
            upid = self.api.upload_iso(
                node, self.config.iso_storage, filename=name, content=iso, deadline=deadline
            )
        except ReplyLost as err:
            # Maybe applied: the record says so, and the next run reads back first.
            return fail(dict(progress, upload_sent=True), "upload", err, op=OP)
        return StepResult(
            "wait",
            advance(progress, "upload_wait", upid=upid, since=self.clock(), upload_sent=None),
            "upload",
            delay=self.budgets.poll_interval,
            upid=upid,
            submitted=True,
            message=f"uploaded {name} ({len(iso)} bytes)",
        )

    def _read_back_seed(
        self,
        node: str,
        name: str,
        size: int,
        progress: Progress,
        deadline: Deadline | None,
    ) -> StepResult | None:
        """After a lost upload reply: the step that settles it, or None to upload again.

        The running copies are read before the storage, not after: a copy that ends between the
        two reads would otherwise be missed by both (no seed yet, no copy running any more) and
        the seed sent twice. Read in this order, no copy running means any applied upload had
        already written its seed, which the storage read then shows."""
        # The copy of an upload (pve-reference §7.7) may still be running: wait, then look again.
        if self.api.node_tasks(node, typefilter="imgcopy", source="active", deadline=deadline):
            return StepResult(
                "wait",
                progress,
                "upload",
                delay=self.budgets.poll_interval,
                message="a seed upload is still being copied on the node; reading back again "
                "before deciding",
            )
        cloned_at = progress.get("cloned_at")
        volid = seed_volid(self.config.iso_storage, name)
        for item in self.api.storage_content(
            node, self.config.iso_storage, content="iso", deadline=deadline
        ):
            if (
                item.get("volid") == volid
                and int(item.get("size") or 0) == size
                and cloned_at is not None
                and int(item.get("ctime") or 0) >= int(cloned_at)
            ):
                return StepResult(
                    "continue",
                    advance(progress, "configure", upload_sent=None),
                    "upload",
                    message=f"{name} was uploaded by the submission whose reply was lost",
                )
        return None

    def _upload_wait(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        return self.poll(progress, "upload_wait", self.budgets.upload, "configure", deadline)

    def _configure(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        config = self.api.vm_config(node, vmid, deadline=deadline)
        # The clone's identity (seed 001), from the read this step makes anyway: Proxmox gave
        # it a fresh SMBIOS UUID and vmgenid (pve-reference §7.14), and a config write keeps them.
        made = identity_of(config)
        progress = dict(progress, smbios_uuid=made.smbios_uuid, vmgenid=made.vmgenid)
        machine = resolve_machine_type(self.config, req.machine_type)
        wanted = desired_config(
            config,
            self.config,
            req.vm_name,
            machine.cores,
            machine.memory_mib,
            seed_name=self.seed_name(req),
        )
        changes = {k: v for k, v in wanted.items() if config.get(k) != v}
        if changes:
            self.api.set_vm_config(node, vmid, changes, deadline=deadline)
        resize = None
        if machine.disk_gib:
            disk = boot_disk(config)
            size = disk_size_bytes(config.get(disk, "")) if disk else None
            if disk is None or size is None:
                raise PermanentError(
                    f"VM {vmid} has no boot disk with a readable size",
                    remediation=TEMPLATE_REMEDIATION,
                    op=OP,
                )
            if gib(machine.disk_gib) > size:
                resize = {"disk": disk, "size": f"{machine.disk_gib}G"}
        stage = "resize" if resize else "start"
        return StepResult(
            "continue",
            # net0's MAC: the guest agent's answer names it, which is how the address stage
            # knows the VM answering is still this one without reading its config (issue 12).
            advance(
                progress,
                stage,
                resize=resize,
                mac=net0_mac(wanted.get("net0") or config.get("net0")),
            ),
            "configure",
            submitted=bool(changes),
            message="configured "
            + (", ".join(sorted(changes)) if changes else "nothing (as wanted)"),
        )

    def _resize(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        resize = progress.get("resize") or {}
        # Warm (issue 12): the configure step just read the size and decided, and no resize of
        # ours was sent since; only a cold record reads the size back (a resize whose reply or
        # record was lost may have grown it already).
        size = None
        if not warm(progress):
            config = self.api.vm_config(node, vmid, deadline=deadline)
            size = disk_size_bytes(config.get(resize.get("disk", ""), ""))
        target = gib(int(str(resize.get("size", "0G")).rstrip("G")))
        if size is not None and size >= target:
            # Grown already (a resize submitted by a round whose reply was lost): never shrink.
            return StepResult(
                "continue",
                advance(progress, "start"),
                "resize",
                message="disk already large enough",
            )
        return self.submit_task(
            progress,
            "resize",
            "resize_wait",
            "resize",
            lambda: self.api.resize(
                node, vmid, disk=resize["disk"], size=resize["size"], deadline=deadline
            ),
            f"growing {resize['disk']} to {resize['size']}",
            deadline,
        )

    def _resize_wait(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        return self.poll(progress, "resize_wait", self.budgets.resize, "start", deadline)

    # --- start and running (entry 10 steps 8 and 9) ----------------------------------------

    def _start(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        # Warm (issue 12): the VM is the stopped clone this create configured, and no start of
        # ours was sent since. Started by someone else meanwhile, the start task fails and
        # ``_start_wait`` finds it running, which is the outcome wanted.
        if not warm(progress):
            status = self.api.vm_status(node, vmid, deadline=deadline)
            if status.get("status") == "running":
                return StepResult(
                    "continue", advance(progress, "running"), "start", message="already running"
                )
        return self.submit_task(
            progress,
            "start",
            "start_wait",
            "qmstart",
            lambda: self.api.start(node, vmid, deadline=deadline),
            f"starting VM {vmid}",
            deadline,
        )

    def _start_wait(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])

        def failed(err: Exception) -> StepResult:
            # A qmstart can report failure while the VM runs (peers were bitten): decide on
            # the observed state, not on the task's exit status alone.
            if self.api.vm_status(node, vmid, deadline=deadline).get("status") == "running":
                return StepResult(
                    "continue",
                    advance(progress, "running"),
                    "start_wait",
                    message=f"start task failed but the VM runs: {err}",
                )
            return fail(advance(progress, "start"), "start_wait", err, op=OP)

        # Beside other tasks of ours on the node, the board's look at its task list answers for
        # this start too (issue 12: one read for every VM a fleet starts), and an end it already
        # saw costs nothing; ``_start_listed``.
        upid = progress.get("upid")
        if self.board is not None and upid:
            look = self.board.look_shared(self.api, str(upid), clock=self.clock, deadline=deadline)
            if look is not None:
                return self._start_listed(req, progress, look, failed, deadline)
        # Alone on its node, the VM's state first (issue 12): a start takes about as long as
        # one poll interval, so the first look usually finds the VM running, which is what
        # step 9 waits for; the task's own status is read only while it does not run yet.
        sent = self.clock()
        status = self.api.vm_status(node, vmid, deadline=deadline)
        if status.get("status") == "running" and status.get("qmpstatus") == "running":
            # Step 9 is met by this read, so the create ends here: a step of its own for
            # "running" read nothing and cost a delivery per create (issue 12's makespan).
            result = self._runs(req, progress, vmid, node)
            result.met = "running"
            # The VM running is what the start's work was (QEMU launched), so this look times
            # the start as a task poll would: without it the start was never learned, every
            # first look came 50 ms after the submission, and one that found the VM not yet
            # running cost the task read and a second status read (issue 12).
            return with_timing(result, str(upid), progress, sent, self.clock()) if upid else result
        since = progress.get("since")
        if since and progress.get("seen_running") is None:
            now = self.clock()
            if now - float(since) <= self.budgets.start:
                # The first look that finds the VM not running yet (a look planned at the
                # start's expected end that came too soon: an estimate probing down, waits.py)
                # waits again without reading the task, so it costs one read, not three (issue
                # 12). A start that failed is read at the next look, a short interval later.
                seen = seen_at(
                    planned=progress.get("look_at"),
                    sent=sent - float(since),
                    landed=now - float(since),
                    running=True,
                )
                return StepResult(
                    "wait",
                    dict(progress, seen_running=seen),
                    "start_wait",
                    delay=self.budgets.poll_interval,
                    upid=progress.get("upid"),
                    message=f"VM {vmid} is not running yet ({status.get('status') or 'no status'})",
                )
        return self.poll(progress, "start_wait", self.budgets.start, "running", deadline, failed)

    def _start_listed(
        self,
        req: CreateRequest,
        progress: Progress,
        look: Look,
        failed: Callable[[Exception], StepResult],
        deadline: Deadline | None,
    ) -> StepResult:
        """The start's wait answered by the node's task list (``task_board``), not by a status
        read: the ``qmstart`` task ends once QEMU runs (``vm_start``, pve-reference §7.16), so
        its end meets step 9 as the status read would. ``/cluster/resources`` would answer for
        every VM too, but its ``status`` lags the VM by up to 10 s (§7.9): every create would
        end that much late. A task that failed is judged on the VM's status (``failed``); a VM
        stopped again right after its start is the boot's look's to find (``boot``)."""
        result = self.poll(
            progress, "start_wait", self.budgets.start, "running", deadline, failed, look=look
        )
        if not look.seen.outcome.succeeded:
            return result  # still starting, or failed and judged by ``failed``
        vmid, node = int(progress["vmid"]), str(progress["node"])
        done = self._runs(req, progress, vmid, node)
        done.met = "running"
        # The look's timing of the start and the other ends it saw, as a poll's.
        done.details.update(result.details)
        return done

    def _running(
        self, req: CreateRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        vmid, node = int(progress["vmid"]), str(progress["node"])
        # Warm with the start's wait having just seen it run (issue 12): step 9 is met by that
        # read; a cold record reads the status again.
        seen = warm(progress) and progress.get("seen_running")
        # Only the start's wait may vouch, once: a record this stage writes never does.
        progress = dict(progress, seen_running=None)
        status = {} if seen else self.api.vm_status(node, vmid, deadline=deadline)
        if seen or (status.get("status") == "running" and status.get("qmpstatus") == "running"):
            return self._runs(req, progress, vmid, node)
        if status.get("status") != "running":
            # Stopped after its start ended (a stop queued on the node before it ran, say):
            # the record goes back to the start, so the next attempt starts it again, as the
            # remediation says; staying here only read "stopped" until the ceiling.
            return fail(
                advance(progress, "start"),
                "running",
                TransientError(
                    f"VM {vmid} is {status.get('status')} after its start",
                    remediation="the next attempt starts it again; the node's task log has details",
                    op=OP,
                ),
                op=OP,
            )
        since = progress.get("since") or self.clock()
        if self.clock() - since > self.budgets.running:
            raise TransientError(
                f"VM {vmid} did not reach running within {int(self.budgets.running)} s "
                f"(qmpstatus {status.get('qmpstatus')})",
                op=OP,
            )
        return StepResult(
            "wait", dict(progress, since=since), "running", delay=self.budgets.poll_interval
        )

    def _runs(self, req: CreateRequest, progress: Progress, vmid: int, node: str) -> StepResult:
        """The create's end: its VM runs (entry 10 step 9), as a read just saw."""
        return StepResult(
            "done",
            advance(progress, "done"),
            "running",
            provider_id=format_provider_id(vmid, req.vm_name),
            message=f"VM {vmid} is running on {node}",
            details=_identity_details(progress),
        )


def _identity_details(progress: Progress) -> dict[str, Any]:
    """The VM's identity for the caller to record (seed 001), as the progress holds it."""
    return {
        "smbios_uuid": str(progress.get("smbios_uuid") or ""),
        "vmgenid": str(progress.get("vmgenid") or ""),
    }


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _node_time(upid: str) -> int | None:
    """The node's start time of a task (pve-reference §4.1), or None when unreadable."""
    try:
        return parse_upid(upid).starttime
    except ValueError:
        return None
