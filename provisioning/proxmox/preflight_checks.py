"""The checks of a preflight, each ``passed``, ``failed`` or ``unknown`` (seed 003).

A check passes only on an observation that proves its claim; one whose read got no answer, or
that depends on a read that got none, is ``unknown``, never ``passed``. Messages are written
here. They name only what proxyhub chose (the catalogue's nodes, storages, bridge, VMIDs and
keys) and never echo a Proxmox message, body, or a value read from a config (the template's own
storage and bridge are "the template disk's storage" and "the template's net0 bridge").

The checks (``CHECK_CODES`` in ``preflight.py`` orders them): the template exists (listing; a
VMID missing from the permission-filtered listing is told apart from an absent one by
``/cluster/nextid``), is a template, has no Proxmox cloud-init drive (seed 000 entry 4), has a
boot disk with a readable size no larger than ``diskGiB`` (only when the machine type sets one:
Proxmox never shrinks, so the VM would keep the larger disk and not match the plan); the ISO
storage is active on the node, allows ``iso`` and has room for the seed; the target storage
(``storage``, else the template disk's own, as a full clone keeps it) is active, allows
``images``, is shared when the clone crosses nodes, and has room for the disks; the bridge
exists on the node (``bridge``, else the template's net0 bridge); the VMID candidate is free;
the nodes involved answer.

The VMID decision: seed 003 creates exactly its requested VMID, so a taken one fails there. Our
create probes on (seed 000 entry 2), so a taken candidate does not block it, but the plan's VMID
would not be the VM's. It is ``failed`` with a message that says the create is not blocked,
because ``passed`` would vouch for a VMID the VM will not get and ``unknown`` would hide an
observation. A candidate that already holds *this* proxy's VM passes (the create adopts it);
one held by a VM still locked or mid-clone is ``unknown`` until its task ends. Seed 003's
dedicated ``GET /cluster/nextid?vmid=<candidate>`` is the availability check: a listing filtered
by the token's permissions cannot prove a VMID free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from .disks import GIB, boot_disk, cloudinit_drive, disk_size_bytes, gib, is_cdrom, is_disk_key
from .errors import ClassifiedError
from .ownership import judge
from .preflight_reads import PreflightReads, try_read
from .privileges import AclTargets, compare, required_by_path

Status = Literal["passed", "failed", "unknown"]

# Room the seed ISO needs on isoStorage beyond the cloud-init itself: ISO 9660 structures,
# meta-data and vendor-data come to well under 1 MiB; the rest is margin.
SEED_HEADROOM_BYTES = 4 * 1024**2
MIB = 1024**2


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``code`` from ``CHECK_CODES``, a status and a fixed message."""

    code: str
    status: Status
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "status": self.status, "message": self.message}


class PreflightChecks(PreflightReads):
    """The checks of one preflight run, one method per code, over the run's shared reads."""

    # --- the template (seed 000 entry 4) ------------------------------------------------

    def template_exists(self) -> Check:
        code, vmid, cluster = "template_exists", self.plan.template_vmid, self.plan.cluster
        listing = self._listing()
        if not listing.ok:
            return Check(
                code,
                "unknown",
                f"whether template VM {vmid} exists could not be checked: {listing.reason()}",
            )
        entry = self._entry(vmid)
        if entry is not None:
            if entry.get("type") != "qemu":
                return Check(
                    code,
                    "failed",
                    f"VMID {vmid} is a container, not a VM template: point image "
                    f"{self.plan.image} at a VM template",
                )
            return Check(code, "passed", f"template VM {vmid} exists in cluster {cluster}")
        # Absent from a listing filtered by VM.Audit: nextid tells hidden from absent.
        probe = try_read(lambda: self.api.cluster_nextid(vmid=vmid, deadline=self.deadline))
        if probe.param_error("vmid"):
            return Check(
                code,
                "unknown",
                f"VM {vmid} exists but the API token cannot see it: grant VM.Audit on /vms/{vmid}",
            )
        if probe.ok:
            return Check(
                code,
                "failed",
                f"no VM {vmid} exists in cluster {cluster}: create the template or point "
                f"image {self.plan.image} at an existing one",
            )
        return Check(
            code,
            "unknown",
            f"template VM {vmid} is not in the listing, and whether it exists could not be "
            f"checked: {probe.reason()}",
        )

    def template_is_template(self) -> Check:
        code, vmid = "template_is_template", self.plan.template_vmid
        config, why = self._template_config()
        if config is None:
            return Check(code, "unknown", f"whether VM {vmid} is a template is unknown: {why}")
        if str(config.get("template", "0")) != "1":
            return Check(
                code,
                "failed",
                f"VM {vmid} is not a template: convert it to a template or point image "
                f"{self.plan.image} at one",
            )
        return Check(code, "passed", f"VM {vmid} is a template")

    def template_no_cloudinit_drive(self) -> Check:
        code, vmid = "template_no_cloudinit_drive", self.plan.template_vmid
        config, why = self._template_config()
        if config is None:
            return Check(
                code, "unknown", f"whether template {vmid} has a cloud-init drive is unknown: {why}"
            )
        if cloudinit_drive(config):
            return Check(
                code,
                "failed",
                f"template {vmid} has a Proxmox cloud-init drive, which would compete with "
                "proxyhub's seed ISO: remove the drive from the template",
            )
        return Check(code, "passed", f"template {vmid} has no Proxmox cloud-init drive")

    def template_boot_disk(self) -> Check:
        """Seed 000 entry 6: the resize needs the boot disk and its size, and only grows."""
        code, vmid = "template_boot_disk", self.plan.template_vmid
        target = self.plan.disk_gib
        assert target is not None  # the check runs only when the plan sets diskGiB
        config, why = self._template_config()
        if config is None:
            return Check(code, "unknown", f"template {vmid}'s boot disk is unknown: {why}")
        disk = boot_disk(config)
        size = disk_size_bytes(config.get(disk, "")) if disk else None
        if disk is None or size is None:
            return Check(
                code,
                "failed",
                f"template {vmid} has no boot disk with a readable size, so the create cannot "
                f"grow it to {target} GiB",
            )
        if size > gib(target):
            return Check(
                code,
                "failed",
                f"template {vmid}'s boot disk is larger than {target} GiB and would need "
                "shrinking, which Proxmox never does: the VM would keep the larger disk; raise "
                f"diskGiB of machine type {self.plan.machine_type} or use a smaller template",
            )
        if size == gib(target):
            return Check(
                code, "passed", f"template {vmid}'s boot disk is already {target} GiB: no resize"
            )
        return Check(
            code,
            "passed",
            f"template {vmid}'s boot disk is smaller than {target} GiB: the create grows it",
        )

    # --- storages -----------------------------------------------------------------------

    def iso_storage(self) -> Check:
        """Seed 000 entry 5: the seed is uploaded to isoStorage on the proxy's node."""
        code, node, storage = "iso_storage", self.plan.node, self.plan.iso_storage
        label = f"isoStorage {storage} on node {node}"
        read = self._storage_status(node, storage)
        if read.param_error("storage"):
            return Check(code, "failed", f"{label} does not exist: add it or set isoStorage")
        if not read.ok:
            return Check(
                code,
                "unknown",
                f"{label} could not be checked: "
                f"{read.reason(f'Datastore.Audit on /storage/{storage}')}",
            )
        status = read.value
        problem = _inactive(status) or _without(status, "iso", "ISO images")
        if problem:
            return Check(code, "failed", f"{label} {problem}")
        avail = _number(status.get("avail"))
        vendor = len((self.config.vendor_data or "").encode("utf-8"))
        need = self.plan.cloud_init_bytes + vendor + SEED_HEADROOM_BYTES
        if avail is None:
            return Check(code, "unknown", f"{label} did not report its free space")
        if avail < need:
            return Check(
                code,
                "failed",
                f"{label} has less than {_mib(need)} MiB free, which the seed ISO needs",
            )
        return Check(
            code, "passed", f"{label} is active, allows ISO images and has room for the seed"
        )

    def target_storage(self) -> Check:
        """Where the clone's disks land: ``storage`` (the full clone's target, pve-reference
        §7.14), else where the template's disks are: without it, qemu-server copies each disk
        onto the storage it is on. ``target`` needs that storage shared (§7.14)."""
        code, node, vmid = "target_storage", self.plan.node, self.plan.template_vmid
        config, why = self._template_config()
        storage = self.plan.storage
        if storage is not None:
            label = f"storage {storage}"
        else:
            label = "the template disk's storage"
            if config is None:
                return Check(code, "unknown", f"{label} is unknown: {why}")
            storage = _disk_storage(config)
            if storage is None:
                return Check(
                    code, "failed", f"template {vmid} has no boot disk on a storage to clone"
                )
        read = self._storage_status(node, storage)
        if read.param_error("storage"):
            return Check(code, "failed", f"{label} does not exist on node {node}")
        if not read.ok:
            return Check(
                code,
                "unknown",
                f"{label} on node {node} could not be checked: "
                f"{read.reason('Datastore.Audit on the storage')}",
            )
        status = read.value
        problem = _inactive(status) or _without(status, "images", "VM disk images")
        if problem:
            return Check(code, "failed", f"{label} on node {node} {problem}")
        template_node = self._template_node()
        if template_node is not None and template_node != node and not status.get("shared"):
            return Check(
                code,
                "failed",
                f"{label} is not shared, so template {vmid} cannot be cloned onto node {node}: "
                "use a shared storage or place the proxy on the template's node",
            )
        avail = _number(status.get("avail"))
        need = _clone_bytes(config, self.plan.storage, storage, self.plan.disk_gib)
        floor = gib(self.plan.disk_gib) if self.plan.disk_gib else 0
        if avail is not None and avail < max(need or 0, floor):
            return Check(
                code,
                "failed",
                f"{label} on node {node} has less free space than the VM's disks need "
                f"({_gib(max(need or 0, floor))} GiB)",
            )
        if avail is None or need is None:
            return Check(
                code,
                "unknown",
                f"{label} on node {node} allows VM disk images, but its free space could not "
                "be compared with the disks' size",
            )
        return Check(
            code,
            "passed",
            f"{label} on node {node} is active, allows VM disk images and has room for the disks",
        )

    # --- network (seed 000 entry 7) -------------------------------------------------------

    def bridge(self) -> Check:
        code, node, vmid = "bridge", self.plan.node, self.plan.template_vmid
        config, why = self._template_config()
        net0_known = config is not None
        if config is not None and "net0" not in config:
            if self.plan.rewrites_net0:
                return Check(
                    code,
                    "failed",
                    f"template {vmid} has no net0 to put on the configured bridge or VLAN",
                )
            return Check(
                code, "failed", f"template {vmid} has no net0: the proxy would have no network"
            )
        if self.plan.bridge is not None:
            bridge, label = self.plan.bridge, f"bridge {self.plan.bridge}"
        else:
            label = "the template's net0 bridge"
            if config is None:
                return Check(code, "unknown", f"{label} is unknown: {why}")
            found = _option(config["net0"], "bridge")
            if not found:
                return Check(code, "failed", f"template {vmid}'s net0 is on no bridge: set bridge")
            bridge = found
        read = self._once(
            f"network:{node}", lambda: self.api.node_network(node, deadline=self.deadline)
        )
        if not read.ok:
            return Check(
                code, "unknown", f"{label} on node {node} could not be checked: {read.reason()}"
            )
        ifaces = {str(i.get("iface")): i for i in read.value if isinstance(i, Mapping)}
        iface = ifaces.get(bridge)
        if iface is None:
            # The listing holds local bridges; an SDN vnet is not among them.
            return Check(code, "failed", f"{label} does not exist on node {node}")
        if "active" in iface and not iface.get("active"):
            return Check(code, "failed", f"{label} exists on node {node} but is not active")
        if not net0_known:
            return Check(
                code,
                "unknown",
                f"{label} exists on node {node}, but whether template {vmid} has a net0 is "
                f"unknown: {why}",
            )
        return Check(code, "passed", f"{label} exists on node {node}")

    # --- VMID (seed 000 entry 2; seed 003's nextid check) -----------------------------------

    def vmid_candidate(self) -> Check:
        code, plan = "vmid_candidate", self.plan
        vmid = plan.vmid_candidate
        if vmid is None or plan.uid is None:
            return Check(
                code,
                "unknown",
                "the proxy has no UID yet, so its VMID candidate is drawn when it is created",
            )
        read = try_read(lambda: self.api.cluster_nextid(vmid=vmid, deadline=self.deadline))
        if read.ok:
            if int(read.value) == vmid:
                return Check(
                    code,
                    "passed",
                    f"VMID {vmid} is free at this moment (not reserved: the clone is the "
                    "reservation)",
                )
            return Check(code, "unknown", f"Proxmox did not confirm VMID {vmid} free")
        if not read.param_error("vmid"):
            return Check(code, "unknown", f"VMID {vmid} could not be checked: {read.reason()}")
        taken = (
            f"VMID {vmid} is taken by another VM; the create is not blocked (it probes the "
            f"next VMIDs), but the VM will not get VMID {vmid}"
        )
        listing = self._listing()
        if not listing.ok:
            return Check(
                code,
                "unknown",
                f"VMID {vmid} is taken, and whose VM it is could not be checked: "
                f"{listing.reason()}",
            )
        entry = self._entry(vmid)
        if entry is None:
            return Check(code, "failed", taken)
        uid, vm_name = plan.uid, plan.vm_name
        try:
            judged = try_read(
                lambda: judge(
                    self.api,
                    vmid,
                    entry,
                    vm_name=vm_name,
                    uid=uid,
                    installation=plan.installation_id,
                    deadline=self.deadline,
                )
            )
        except ClassifiedError:
            # judge_config's refusal: this proxy's name on a VM without this proxy's mark.
            return Check(
                code,
                "failed",
                f"VMID {vmid} holds a VM named {vm_name} that is not this proxy's: the create "
                "would stop until an operator renames or removes it",
            )
        if not judged.ok:
            return Check(
                code,
                "unknown",
                f"VMID {vmid} is taken, and whose VM it is could not be checked: "
                f"{judged.reason(f'VM.Audit on /vms/{vmid}')}",
            )
        verdict = judged.value
        if verdict.verdict == "ours":
            return Check(code, "passed", f"VMID {vmid} holds this proxy's VM: the create adopts it")
        if verdict.verdict == "busy":
            return Check(
                code,
                "unknown",
                f"VMID {vmid} holds a VM that is locked or still being cloned; whose it is "
                "shows when its task ends",
            )
        if verdict.verdict == "free":
            return Check(code, "passed", f"VMID {vmid} was freed at this moment (not reserved)")
        return Check(code, "failed", taken)

    # --- nodes ------------------------------------------------------------------------------

    # --- the token's privileges (issue 14) ----------------------------------------------

    def privileges(self) -> Check:
        """With a pool configured (a bootstrapped cluster), the token's own permissions (``GET
        /access/permissions``) against what this plan's create needs on its pool, template,
        storages, bridge and node: a missing privilege fails, naming it and its path; one
        beyond proxyhub's role is a warning in the message."""
        code, vmid = "privileges", self.plan.template_vmid
        config, why = self._template_config()
        storages = {self.plan.iso_storage}
        bridges: set[str] = set()
        if self.plan.storage:
            storages.add(self.plan.storage)
        if self.plan.bridge:
            bridges.add(self.plan.bridge)
        if (not self.plan.storage or not self.plan.bridge) and config is None:
            return Check(code, "unknown", f"privileges could not be checked: {why}")
        if config is not None:
            if not self.plan.storage:
                storages.update(
                    s
                    for key, value in config.items()
                    if is_disk_key(key)
                    and not is_cdrom(value)
                    and (s := _volume_storage(value)) is not None
                )
            if not self.plan.bridge and (bridge := _option(config.get("net0", ""), "bridge")):
                bridges.add(bridge)
        targets = AclTargets(
            pool=str(self.config.pool),
            templates=(vmid,),
            storages=tuple(sorted(storages)),
            bridges=tuple(sorted(bridges)),
            nodes=(self.plan.node,),
        )
        read = self._once("permissions", lambda: self.api.permissions(deadline=self.deadline))
        if not read.ok:
            return Check(code, "unknown", f"privileges could not be checked: {read.reason()}")
        report = compare(required_by_path(targets), read.value)
        warnings = "; ".join(
            f"{priv} on {path} is beyond proxyhub's role"
            for path, privs in report.extra.items()
            for priv in privs
        )
        if report.missing:
            missing = "; ".join(
                f"missing {priv} on {path}"
                for path, privs in report.missing.items()
                for priv in privs
            )
            return Check(code, "failed", missing + (f" (warning: {warnings})" if warnings else ""))
        message = "the token holds every privilege the create needs"
        return Check(code, "passed", message + (f" (warning: {warnings})" if warnings else ""))

    def node_online(self) -> Check:
        """The proxy's node, and the template's when the clone runs elsewhere (§1.4: 595)."""
        code, node = "node_online", self.plan.node
        wanted = [(node, f"node {node}")]
        template_node = self._template_node()
        if template_node is not None and template_node != node:
            name = f"node {template_node}" if template_node in self.config.nodes else "another node"
            wanted.append((template_node, f"the template's {name}"))
        offline: list[str] = []
        unknown: list[str] = []
        for name, label in wanted:
            read = self._once(
                f"node:{name}", partial(self.api.node_status, name, deadline=self.deadline)
            )
            if read.failure == "offline":
                offline.append(label)
            elif not read.ok:
                unknown.append(f"{label} ({read.reason(f'Sys.Audit on /nodes/{name}')})")
        if offline:
            return Check(
                code,
                "failed",
                f"{' and '.join(offline)} did not answer: offline or unreachable from the cluster",
            )
        if unknown:
            return Check(code, "unknown", f"could not be checked: {'; '.join(unknown)}")
        labels = " and ".join(label for _, label in wanted)
        return Check(code, "passed", f"{labels} {'is' if len(wanted) == 1 else 'are'} online")


# --- helpers --------------------------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _inactive(status: Mapping[str, Any]) -> str:
    """pve-reference §7.4: a storage restricted to other nodes reads ``enabled: 0, active: 0``."""
    if not status.get("enabled", 1) or not status.get("active"):
        return "is not enabled and active"
    return ""


def _without(status: Mapping[str, Any], content: str, what: str) -> str:
    allowed = {c.strip() for c in str(status.get("content", "")).split(",")}
    return "" if content in allowed else f"does not allow {what} (content {content})"


def _option(value: str, key: str) -> str | None:
    for part in value.split(","):
        name, sep, found = part.strip().partition("=")
        if sep and name == key:
            return found
    return None


def _volume_storage(value: str) -> str | None:
    """``vmstore:base-9000-disk-0,size=3G`` → ``vmstore`` (None for a passthrough path)."""
    volume = value.split(",", 1)[0]
    storage, sep, _ = volume.partition(":")
    return storage if sep and storage and "/" not in storage else None


def _disk_storage(config: Mapping[str, str]) -> str | None:
    disk = boot_disk(config)
    return _volume_storage(config[disk]) if disk else None


def _clone_bytes(
    config: Mapping[str, str] | None,
    configured: str | None,
    storage: str,
    disk_gib: int | None,
) -> int | None:
    """Bytes the clone puts on ``storage``: every disk when ``storage`` is configured (the
    clone moves them all there), else the template's disks already on it; the boot disk counted
    at its grown size. None when a size cannot be read."""
    if config is None:
        return None
    boot = boot_disk(config)
    total = 0
    for key, value in config.items():
        if not is_disk_key(key) or is_cdrom(value):
            continue
        if configured is None and _volume_storage(value) != storage:
            continue
        size = disk_size_bytes(value)
        if size is None:
            return None
        if key == boot and disk_gib:
            size = max(size, gib(disk_gib))
        total += size
    return total


def _mib(n: float) -> int:
    return -(-int(n) // MIB)


def _gib(n: float) -> int:
    return -(-int(n) // GIB)
