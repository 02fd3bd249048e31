"""A template build, as a resumable step machine (issue 14; seed 004: downloaded images).

The node downloads the cloud image itself, a VM is created with its disk imported from it, and
the VM becomes a template. The stages, in order (each call runs one; see ``steps.StepResult``):

``lookup``        judge the node's storages (``build_inputs.judge_storages``) and the VMID: free
                  means download; a VM there that carries this build's mark is ours (a create
                  whose reply was lost, or a build that ran before) and is taken up where it
                  stands; any other VM is never touched
``download``      ``download-url`` with the checksum: a ``download`` task (pve-reference §7.8)
``download_wait`` poll it; a checksum mismatch fails the build for good
``create``        ``POST /nodes/{node}/qemu``: disk ``<storage>:0,import-from=<image>`` (§5.4),
                  ``agent: 1``, ``serial0: socket`` and ``vga: serial0`` (a serial console), no
                  cloud-init drive (proxyhub brings its own NoCloud seed), the mark in the
                  description as a create writes it (``marks``); a ``qmcreate`` task
``create_wait``   poll it
``resize``        grow the imported disk to ``disk_gib`` when it is smaller (a ``resize`` task)
``resize_wait``   poll it
``convert``       ``POST .../template``: a ``qmtemplate`` task
``convert_wait``  poll it
``verify``        read the config back: a template, no cloud-init drive; done

Receipts (seed 001): every UPID is in the record before the wait starts and a recorded UPID is
only polled. A worker killed after a submission but before its record was saved finds the task
on the node (``steps.submit_once``; for the download, by its file name, §4.5), or, for a create
that already ended, finds the VM at the VMID with this build's mark. Nothing of anybody else's
is ever overwritten or converted: the mark decides, as it does for a proxy's clone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from .build_inputs import InputProblem, Storages, image_filename, judge_storages, parse_checksum
from .deadline import Deadline
from .disks import cloudinit_drive, disk_size_bytes, gib
from .errors import ApiError, PermanentError, TaskFailed, TransientError
from .marks import parse_mark, render_mark
from .ownership import is_missing
from .steps import Progress, StepMachine, StepResult, advance, fail, submit_once, warm

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "template_build"
# Memory and cores of the template: a clone takes its machine type's values at configure.
TEMPLATE_MEMORY_MIB = 1024
# A node's clock may be this far behind ours: a download task that started after the build's
# lookup, less this, is taken for the build's own (a worker killed before its record was saved).
CLOCK_SKEW_SECONDS = 120


@dataclass(frozen=True)
class TemplateBuildRequest:
    """What a build needs. ``uid`` is the build's id, written into the VM's mark; ``checksum``
    is ``ALGORITHM:HEX``; ``image_storage`` empty lets the lookup choose one on the node."""

    uid: str
    key: str
    node: str
    vmid: int
    url: str
    checksum: str
    storage: str
    image_storage: str = ""
    bridge: str = ""
    disk_device: str = "scsi0"
    disk_gib: int = 8
    # A per-node copy (``--all-nodes``): not needed when the disk storage turns out shared.
    copy: bool = False

    @property
    def vm_name(self) -> str:
        return f"tpl-{self.key}"

    @classmethod
    def from_record(cls, build: Mapping[str, Any]) -> TemplateBuildRequest:
        """The request from the ``build`` record an operation's progress keeps (written by
        ``services.template_builds``), so a resumed build needs nothing but its journal."""
        return cls(
            uid=build["uid"],
            key=build["key"],
            node=build["node"],
            vmid=int(build["vmid"]),
            url=build["url"],
            checksum=build["checksum"],
            storage=build["storage"],
            image_storage=build.get("image_storage") or "",
            bridge=build.get("bridge") or "",
            disk_device=build.get("disk_device") or "scsi0",
            disk_gib=int(build.get("disk_gib") or 8),
            copy=not build.get("primary", True),
        )


def new_progress() -> Progress:
    return {"v": 1, "stage": "lookup", "upid": None, "since": None}


def storages_of(progress: Progress) -> Storages:
    return Storages(**progress["storages"])


class TemplateBuildMachine(StepMachine[TemplateBuildRequest]):
    """Runs one stage of a build per call. Stateless: everything lives in the record."""

    op = OP
    first_stage = "lookup"

    def on_api_error(self, progress: Progress, stage: str, err: ApiError) -> StepResult:
        if is_missing(err) and stage not in ("lookup", "download", "download_wait"):
            # Our VM vanished between steps: judge the VMID again from the lookup.
            return fail(advance(progress, "lookup"), stage, err, op=OP)
        return fail(progress, stage, err, op=OP)

    def on_done(self, req: TemplateBuildRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox template built",
            extra={"vmid": req.vmid, "node": req.node, "template_key": req.key},
        )

    # --- lookup ---------------------------------------------------------------------------

    def _lookup(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        try:
            storages = judge_storages(
                self.api.node_storages(req.node, deadline=deadline),
                node=req.node,
                storage=req.storage,
                image_storage=req.image_storage,
                filename=image_filename(req.url),
            )
        except InputProblem as err:
            raise PermanentError(str(err), remediation="fix the build's inputs", op=OP) from None
        progress = dict(progress, storages=storages.__dict__, listed_at=self.clock())
        if req.copy and storages.disk_shared:
            # Requested without knowing the storage (the admin makes no Proxmox call): a
            # template on shared storage serves every node, so this copy is not made.
            return StepResult(
                "done",
                advance(progress, "done", shared=True),
                "lookup",
                message=f"{req.storage} is shared: the template serves {req.node}; no copy made",
                details={"shared": True},
            )
        listing = self.api.cluster_resources(deadline=deadline)
        entry = next((e for e in listing if int(e.get("vmid") or 0) == req.vmid), None)
        if entry is None:
            created_at = progress.get("created_at") or self.clock()
            return StepResult(
                "continue",
                advance(progress, "download", created_at=created_at),
                "lookup",
                message=f"VMID {req.vmid} is free",
            )
        node = str(entry.get("node") or "")
        config = self.api.vm_config(node, req.vmid, deadline=deadline)
        if not self._ours(req, config) or entry.get("type") != "qemu":
            raise PermanentError(
                f"VMID {req.vmid} is taken by a guest this build did not make (on {node})",
                remediation="choose another --vmid; proxyhub never overwrites or converts a VM "
                "it did not make",
                op=OP,
            )
        if node != req.node:
            raise PermanentError(
                f"this build's VM {req.vmid} is on {node}, not on {req.node}",
                remediation=f"move it back to {req.node} or destroy it, then retry",
                op=OP,
            )
        if config.get("lock"):
            since = progress.get("since") or self.clock()
            if self.clock() - since > self.budgets.lock_wait:
                raise TransientError(
                    f"VM {req.vmid} stayed locked ({config['lock']}) too long",
                    remediation=f"if no task runs on it, `qm unlock {req.vmid}`",
                    op=OP,
                )
            return StepResult(
                "wait",
                dict(progress, since=since),
                "lookup",
                delay=self.budgets.poll_interval,
                message=f"VM {req.vmid} is locked ({config['lock']}); waiting",
            )
        stage = "verify" if str(config.get("template", "0")) == "1" else "resize"
        return StepResult(
            "continue",
            advance(progress, stage),
            "lookup",
            message=f"VM {req.vmid} is this build's; going on at {stage}",
        )

    def _ours(self, req: TemplateBuildRequest, config: dict[str, Any]) -> bool:
        mark = parse_mark(config.get("description"))
        return (
            mark.managed
            and mark.uid == req.uid
            and mark.installation == self.config.installation_id
        )

    # --- download (seed 004: downloaded images) --------------------------------------------

    def _download(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        storages = storages_of(progress)
        algorithm, digest = parse_checksum(req.checksum)
        task_id = quote(storages.filename, safe="")
        if not warm(progress):
            # A worker killed after its download was sent, before the record was saved: the
            # node lists the task (running, or ended OK after our lookup). Take it as ours.
            mine = self._recent_download(req, progress, task_id, deadline)
            if mine is not None:
                return self._waiting(progress, "download_wait", mine, "found the build's download")
        return submit_once(
            self.api,
            progress,
            step="download",
            next_stage="download_wait",
            node=req.node,
            vmid=req.vmid,
            task_type="download",
            task_id=task_id,
            submit=lambda: self.api.download_url(
                req.node,
                storages.image_storage,
                url=req.url,
                filename=storages.filename,
                content=storages.image_content,
                checksum=digest,
                algorithm=algorithm,
                deadline=deadline,
            ),
            message=f"node {req.node} downloads {storages.image_volid}",
            poll_interval=self.budgets.poll_interval,
            op=OP,
            clock=self.clock,
            deadline=deadline,
            warm=warm(progress),
        )

    def _recent_download(
        self,
        req: TemplateBuildRequest,
        progress: Progress,
        task_id: str,
        deadline: Deadline | None,
    ) -> str | None:
        after = float(progress.get("listed_at") or self.clock()) - CLOCK_SKEW_SECONDS
        for task in self.api.node_tasks(
            req.node, typefilter="download", source="all", limit=10, deadline=deadline
        ):
            if str(task.get("id")) != task_id or int(task.get("starttime") or 0) < after:
                continue
            if "endtime" not in task or task.get("status") in (None, "RUNNING", "OK"):
                return str(task["upid"])
        return None

    def _waiting(self, progress: Progress, stage: str, upid: str, message: str) -> StepResult:
        return StepResult(
            "wait",
            advance(progress, stage, upid=upid, since=self.clock()),
            stage.removesuffix("_wait"),
            delay=self.budgets.poll_interval,
            upid=upid,
            message=f"{message} {upid}",
        )

    def _download_wait(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        def failed(err: TaskFailed) -> StepResult:
            if "checksum mismatch" in err.exitstatus:
                return StepResult(
                    "error",
                    advance(progress, "download"),
                    "download_wait",
                    upid=err.upid,
                    error=PermanentError(
                        f"the image's checksum is wrong: {err.exitstatus}",
                        remediation="check --checksum against the image's published checksum; "
                        "nothing was created",
                        op=OP,
                    ),
                )
            # Anything else (the URL unreachable...) may heal: download again.
            return fail(advance(progress, "download"), "download_wait", err, op=OP)

        return self.poll(progress, "download_wait", self.budgets.clone, "create", deadline, failed)

    # --- create ----------------------------------------------------------------------------

    def _create(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        storages = storages_of(progress)
        config = self.vm_config_for(req, storages, float(progress["created_at"]))
        try:
            return self.submit_task(
                dict(progress, node=req.node, vmid=req.vmid),
                "create",
                "create_wait",
                "qmcreate",
                lambda: self.api.create_vm(req.node, req.vmid, config, deadline=deadline),
                f"creating VM {req.vmid} from {storages.image_volid}",
                deadline,
            )
        except ApiError as err:
            if err.status == 500 and "already exists" in err.message:
                # Ours whose record was lost, or someone else's: the mark decides.
                return StepResult(
                    "continue",
                    advance(progress, "lookup"),
                    "create",
                    message=f"VMID {req.vmid} is taken; checking whose it is",
                )
            raise

    def vm_config_for(
        self, req: TemplateBuildRequest, storages: Storages, created_at: float
    ) -> dict[str, str]:
        """The new VM: the imported disk, the agent, a serial console, no cloud-init drive."""
        mark = render_mark(
            req.uid, datetime.fromtimestamp(created_at, UTC), self.config.installation_id
        )
        config = {
            "name": req.vm_name,
            "description": mark,
            req.disk_device: f"{storages.disk_storage}:0,import-from={storages.image_volid}",
            "boot": f"order={req.disk_device}",
            "agent": "1",
            "serial0": "socket",
            "vga": "serial0",
            "ostype": "l26",
            "memory": str(TEMPLATE_MEMORY_MIB),
            "cores": "1",
        }
        if self.config.pool:
            # VM.Allocate on the pool stands in for it on /vms/<vmid> (the create's
            # permission), and the pool's ACL then covers the resize and the conversion.
            config["pool"] = self.config.pool
        if req.disk_device.startswith("scsi"):
            config["scsihw"] = "virtio-scsi-pci"
        if req.bridge:
            config["net0"] = f"virtio,bridge={req.bridge}"
        return config

    def _create_wait(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        def failed(err: TaskFailed) -> StepResult:
            # Proxmox removed the half-made VM; the next attempt judges the VMID again.
            return fail(advance(progress, "lookup"), "create_wait", err, op=OP)

        return self.poll(progress, "create_wait", self.budgets.clone, "resize", deadline, failed)

    # --- resize, convert, verify -------------------------------------------------------------

    def _resize(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        config = self.api.vm_config(req.node, req.vmid, deadline=deadline)
        size = disk_size_bytes(config.get(req.disk_device, "")) or 0
        if size >= gib(req.disk_gib):
            return StepResult(
                "continue", advance(progress, "convert"), "resize", message="disk large enough"
            )
        return self.submit_task(
            dict(progress, node=req.node, vmid=req.vmid),
            "resize",
            "resize_wait",
            "resize",
            lambda: self.api.resize(
                req.node, req.vmid, disk=req.disk_device, size=f"{req.disk_gib}G", deadline=deadline
            ),
            f"growing {req.disk_device} to {req.disk_gib} GiB",
            deadline,
        )

    def _resize_wait(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        return self.poll(progress, "resize_wait", self.budgets.resize, "convert", deadline)

    def _convert(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        config = self.api.vm_config(req.node, req.vmid, deadline=deadline)
        if not self._ours(req, config):
            raise PermanentError(
                f"VM {req.vmid} no longer carries this build's mark",
                remediation="proxyhub converts only a VM it made; check who changed it",
                op=OP,
            )
        if str(config.get("template", "0")) == "1":
            return StepResult("continue", advance(progress, "verify"), "convert")
        return self.submit_task(
            dict(progress, node=req.node, vmid=req.vmid),
            "convert",
            "convert_wait",
            "qmtemplate",
            lambda: self.api.convert_to_template(req.node, req.vmid, deadline=deadline),
            f"converting VM {req.vmid} to a template",
            deadline,
        )

    def _convert_wait(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        return self.poll(progress, "convert_wait", self.budgets.clone, "verify", deadline)

    def _verify(
        self, req: TemplateBuildRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        config = self.api.vm_config(req.node, req.vmid, deadline=deadline)
        if str(config.get("template", "0")) != "1":
            return StepResult("continue", advance(progress, "convert"), "verify")
        drive = cloudinit_drive(config)
        if drive:
            raise PermanentError(
                f"template {req.vmid} has a Proxmox cloud-init drive on {drive}",
                remediation="remove it; proxyhub brings its own NoCloud seed",
                op=OP,
            )
        size = disk_size_bytes(config.get(req.disk_device, "")) or 0
        disk_gib = -(-size // gib(1))
        done = advance(progress, "done", disk_gib=disk_gib, disk=config.get(req.disk_device, ""))
        return StepResult(
            "done",
            done,
            "verify",
            message=f"template {req.vmid} on {req.node}, {disk_gib} GiB {req.disk_device}",
            details={"vmid": req.vmid, "node": req.node, "sourceDiskGiB": disk_gib},
        )
