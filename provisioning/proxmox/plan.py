"""The plan preview: what a create would do, resolved from the catalogue alone (seed 003).

Seed 003 prepares "a reviewable plan": a deterministic description of the intended inputs that
clones, configures, starts, reserves and deletes nothing, saves nothing and enqueues nothing.
``build_plan`` makes **no Proxmox call**; everything it shows comes from the cluster's
``ProxmoxConfig`` and the proxy's own fields, through the very functions the create uses
(``resolve_zone``, ``resolve_machine_type``, ``resolve_template``, ``vmid_for``,
``seed_iso_name``, ``seed_volid``, ``desired_config``), so a preview cannot drift from what the
create machine does, and an unknown catalogue key fails with the create's own
``PermanentError`` (seed 000 entry 3).

What a preview cannot know, it says: the VMID is a *candidate* (attempt 0 of seed 000 entry 2),
observed free by nobody and reserved by nothing (the clone is the reservation); the template's
current disk size needs a Proxmox read, so the resize is "to N GiB when the template's disk is
smaller"; ``created-at`` is written at clone time. The read-only checks belong to
``preflight.py``.

``plan_hash`` is SHA-256 over ``hash_input(plan)``: the compact JSON object whose keys are
``HASH_FIELDS`` in that order (seed 003 hashes a compact JSON tuple in a fixed field order).
It covers the cluster's name and every resolved value, and the cloud-init's SHA-256 and
length, never its content; vendor-data likewise enters only as its SHA-256. The same inputs
always give the same hash and any input that changes the plan changes it. Connection settings
(``url``, ``tokenFile``, ``caFile``, timeouts) and catalogue entries the proxy does not use
are not inputs of the plan, so they do not move its hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from uuid import UUID

from .config import ProxmoxConfig
from .ids import canonical_uid, vmid_for
from .marks import CREATED_AT_KEY, INSTALLATION_KEY, MANAGED_KEY, MANAGED_YES, UID_KEY
from .placement import resolve_machine_type, resolve_template, resolve_zone
from .seed import SEED_SUFFIX, installation_tag, seed_iso_name, seed_volid
from .template import desired_config

# Changes whenever the meaning of a hash input changes, so an old hash never matches a new plan.
PLAN_FORMAT = "proxyhub-plan/1"

NodeSource = Literal["zone", "only node", "placement"]

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

# The hash input's keys, in order, each with the ``Plan`` attribute it reads. Documented here
# because the order is part of the contract: the same plan must hash the same in every
# proxyhub that writes ``PLAN_FORMAT``.
HASH_FIELDS: tuple[tuple[str, str], ...] = (
    ("format", "format"),
    ("cluster", "cluster"),
    ("installation", "installation_id"),
    ("uid", "uid"),
    ("vmName", "vm_name"),
    ("zone", "zone"),
    ("node", "node"),
    ("image", "image"),
    ("templateVmid", "template_vmid"),
    ("vmidMin", "vmid_min"),
    ("vmidMax", "vmid_max"),
    ("vmidCandidate", "vmid_candidate"),
    ("machineType", "machine_type"),
    ("cores", "cores"),
    ("memoryMiB", "memory_mib"),
    ("diskGiB", "disk_gib"),
    ("storage", "storage"),
    ("bridge", "bridge"),
    ("vlanTag", "vlan_tag"),
    ("isoStorage", "iso_storage"),
    ("seedVolid", "seed_volid"),
    ("installGuestAgent", "install_guest_agent"),
    ("vendorDataSha256", "vendor_data_sha256"),
    ("cloudInitSha256", "cloud_init_sha256"),
    ("cloudInitBytes", "cloud_init_bytes"),
    ("keepSeedIso", "keep_seed_iso"),
)

CREATED_AT_LATER = "<written at clone time>"
UID_LATER = "<assigned when the proxy is created>"


@dataclass(frozen=True)
class PlanStep:
    """One stage of the create, named as the create machine and the journal name it."""

    name: str
    description: str


@dataclass(frozen=True)
class Plan:
    """A create, resolved but not run. Build it with ``build_plan``; never by hand.

    ``uid`` is None for a proxy not saved yet (its UID is drawn when it is created), and so is
    ``vmid_candidate``, which derives from it.
    """

    cluster: str
    installation_id: str
    uid: str | None
    vm_name: str
    zone: str
    node: str
    node_source: NodeSource
    image: str
    template_vmid: int
    vmid_min: int
    vmid_max: int
    vmid_candidate: int | None
    machine_type: str
    cores: int
    memory_mib: int
    disk_gib: int | None
    storage: str | None
    bridge: str | None
    vlan_tag: int | None
    iso_storage: str
    seed_iso_name: str
    seed_volid: str
    install_guest_agent: bool
    vendor_data_sha256: str | None
    cloud_init_sha256: str
    cloud_init_bytes: int
    configure: Mapping[str, str]
    mark_lines: tuple[str, ...]
    steps: tuple[PlanStep, ...]
    plan_hash: str = field(default="")
    format: str = PLAN_FORMAT
    # PROXYHUB_KEEP_SEED_ISO: the seed stays after boot instead of being released (issue 11).
    keep_seed_iso: bool = False

    @property
    def extra_vendor_data(self) -> bool:
        """Whether the cluster's ``vendorData`` goes into the seed besides the agent part."""
        return self.vendor_data_sha256 is not None

    @property
    def rewrites_net0(self) -> bool:
        """Seed 000 entry 7: net0 is rewritten only when the cluster sets a bridge or VLAN."""
        return self.bridge is not None or self.vlan_tag is not None

    @property
    def disk_growth(self) -> str:
        if self.disk_gib is None:
            return "the template's size (the machine type sets no diskGiB; no resize)"
        return (
            f"to {self.disk_gib} GiB when the template's boot disk is smaller (its current "
            "size needs a Proxmox read: see the preflight); never shrunk"
        )

    @property
    def network_change(self) -> str:
        if not self.rewrites_net0:
            return "as cloned: net0 keeps the template's bridge and VLAN"
        parts = []
        if self.bridge is not None:
            parts.append(f"bridge={self.bridge}")
        if self.vlan_tag is not None:
            parts.append(f"tag={self.vlan_tag}")
        return f"net0 rewritten in place: {', '.join(parts)} (model and MAC kept)"

    @property
    def node_note(self) -> str:
        return {
            "zone": "the proxy's zone",
            "only node": "the cluster's only node",
            "placement": "chosen by placement (the node with the fewest proxies); fixed when "
            "the create starts",
        }[self.node_source]

    def notes(self) -> list[str]:
        """What the preview does not prove (seed 003: a plan is not an authorisation)."""
        out = [
            "nothing was asked of Proxmox: run the preflight to check the template, storages, "
            "bridge, VMID and node",
            "the VMID is a candidate, not reserved: the clone is the reservation, and a taken "
            "VMID makes the create probe the next ones",
        ]
        if self.uid is None:
            out.append("the UID, and so the VMID candidate, is drawn when the proxy is created")
        if self.disk_gib is not None:
            out.append("the template's current disk size is unknown without a Proxmox call")
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly, for the admin pages and ``--json`` output. Holds no cloud-init or
        vendor-data content, only their hashes."""
        return {
            "planHash": self.plan_hash,
            "format": self.format,
            "cluster": self.cluster,
            "uid": self.uid,
            "vmName": self.vm_name,
            "template": {"image": self.image, "vmid": self.template_vmid},
            "node": {"name": self.node, "source": self.node_source, "note": self.node_note},
            "zone": self.zone,
            "vmid": {
                "candidate": self.vmid_candidate,
                "reserved": False,
                "range": {"min": self.vmid_min, "max": self.vmid_max},
            },
            "resources": {
                "machineType": self.machine_type,
                "cores": self.cores,
                "memoryMiB": self.memory_mib,
                "diskGiB": self.disk_gib,
                "diskGrowth": self.disk_growth,
            },
            "storage": self.storage,
            "network": {
                "bridge": self.bridge,
                "vlanTag": self.vlan_tag,
                "change": self.network_change,
            },
            "seed": {
                "isoStorage": self.iso_storage,
                "isoName": self.seed_iso_name,
                "volid": self.seed_volid,
                "cloudInitSha256": self.cloud_init_sha256,
                "cloudInitBytes": self.cloud_init_bytes,
                "keptAfterBoot": self.keep_seed_iso,
            },
            "vendorData": {
                "installGuestAgent": self.install_guest_agent,
                "extraVendorData": self.extra_vendor_data,
            },
            "configure": dict(self.configure),
            "mark": list(self.mark_lines),
            "steps": [{"name": s.name, "description": s.description} for s in self.steps],
            "notes": self.notes(),
            "liveVerified": False,
        }


def hash_input(plan: Plan) -> str:
    """The canonical compact JSON the plan hash is computed over (``HASH_FIELDS`` order)."""
    values = {key: getattr(plan, attr) for key, attr in HASH_FIELDS}
    return json.dumps(values, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def compute_plan_hash(plan: Plan) -> str:
    return hashlib.sha256(hash_input(plan).encode("ascii")).hexdigest()


def build_plan(
    config: ProxmoxConfig,
    *,
    uid: UUID | str | None,
    vm_name: str,
    zone: str,
    machine_type: str,
    image: str,
    cloud_init_sha256: str,
    cloud_init_bytes: int,
    placement_node: str | None = None,
    vendor_data_digest: str | None = None,
    keep_seed_iso: bool = False,
) -> Plan:
    """The plan of a create of ``vm_name``, without any Proxmox call.

    ``vendor_data_digest`` is the caller's keyed digest of the vendor-data (proxyhub passes an
    HMAC, as for ``cloud_init_sha256``, so the plan hash confirms no guess); without one, the
    vendor-data's plain SHA-256 stands in, for callers that hold no key.

    ``placement_node`` is the node placement would pick for a blank ``zone`` on a multi-node
    cluster (the caller asks placement; this module knows no database). Resolution runs in the
    create's order (zone, machine type, image), so the first bad key raises the same
    ``PermanentError`` the create's lookup would.
    """
    node, source = _resolve_node(config, zone, placement_node)
    machine = resolve_machine_type(config, machine_type)
    template_vmid = resolve_template(config, image, node or "")
    digest = _cloud_init_digest(cloud_init_sha256, cloud_init_bytes)
    uid_text = canonical_uid(uid) if uid is not None else None
    candidate = (
        vmid_for(uid_text, 0, config.vmid_min, config.vmid_max) if uid_text is not None else None
    )
    # Without a uid yet, the seed's name shows where the uid's tag will go.
    seed_name = (
        seed_iso_name(vm_name, installation_id=config.installation_id, uid=uid_text)
        if uid_text is not None
        else f"{vm_name}_{installation_tag(config.installation_id)}_<uid>{SEED_SUFFIX}"
    )
    vendor_sha = (
        (vendor_data_digest or hashlib.sha256(config.vendor_data.encode("utf-8")).hexdigest())
        if config.vendor_data
        else None
    )
    plan = Plan(
        cluster=config.name,
        installation_id=config.installation_id,
        uid=uid_text,
        vm_name=vm_name,
        zone=zone,
        node=node,
        node_source=source,
        image=image,
        template_vmid=template_vmid,
        vmid_min=config.vmid_min,
        vmid_max=config.vmid_max,
        vmid_candidate=candidate,
        machine_type=machine_type,
        cores=machine.cores,
        memory_mib=machine.memory_mib,
        # diskGiB 0 asks for no resize, exactly as an absent one (create.py ``_configure``).
        disk_gib=machine.disk_gib or None,
        storage=config.storage,
        bridge=config.bridge,
        vlan_tag=config.vlan_tag,
        iso_storage=config.iso_storage,
        seed_iso_name=seed_name,
        seed_volid=seed_volid(config.iso_storage, seed_name),
        install_guest_agent=config.install_guest_agent,
        vendor_data_sha256=vendor_sha,
        cloud_init_sha256=digest,
        cloud_init_bytes=cloud_init_bytes,
        # The configure step's writes with the template's config unknown: ``desired_config``
        # adds net0 only once it has read the clone's net0, which ``network_change`` describes.
        configure=desired_config(
            {}, config, vm_name, machine.cores, machine.memory_mib, seed_name=seed_name
        ),
        mark_lines=_mark_lines(uid_text, config.installation_id),
        steps=(),
        keep_seed_iso=keep_seed_iso,
    )
    plan = replace(plan, steps=_steps(plan))
    return replace(plan, plan_hash=compute_plan_hash(plan))


def _resolve_node(
    config: ProxmoxConfig, zone: str, placement_node: str | None
) -> tuple[str, NodeSource]:
    if zone:
        return resolve_zone(config, zone), "zone"
    if len(config.nodes) == 1:
        return resolve_zone(config, ""), "only node"
    if placement_node:
        # Placement picks from config.nodes; resolving it again keeps a stale pick honest.
        return resolve_zone(config, placement_node), "placement"
    # Blank zone, several nodes, nobody asked placement: the create's own refusal.
    return resolve_zone(config, ""), "zone"


def _cloud_init_digest(sha256: str, size: int) -> str:
    """The cloud-init's SHA-256, normalised: no cloud-init hashes as the empty content."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("cloud_init_bytes must be a non-negative integer")
    if not sha256:
        if size:
            raise ValueError("cloud_init_sha256 is required when there is cloud-init content")
        return _EMPTY_SHA256
    if not _SHA256_HEX.fullmatch(sha256):
        raise ValueError("cloud_init_sha256 must be 64 lower-case hexadecimal digits")
    return sha256


def _mark_lines(uid: str | None, installation_id: str) -> tuple[str, ...]:
    """The description mark the clone will carry (marks.render_mark's lines, DESIGN §2)."""
    return (
        f"{MANAGED_KEY}={MANAGED_YES}",
        f"{UID_KEY}={uid if uid is not None else UID_LATER}",
        f"{CREATED_AT_KEY}={CREATED_AT_LATER}",
        f"{INSTALLATION_KEY}={installation_id}",
    )


def _steps(plan: Plan) -> tuple[PlanStep, ...]:
    """The create's stages in the order the machine runs them (create.py, seed 000 entry 10),
    then the service's boot-to-address stage and the seed's release. ``lock_wait`` is left
    out: it appears only when a VMID is found mid-clone, which no preview can foresee."""
    vmid = f"VMID {plan.vmid_candidate}" if plan.vmid_candidate is not None else "the UID's VMID"
    where = plan.storage or "the template disks' storage"
    steps = [
        PlanStep(
            "lookup",
            f"check the placement; list the cluster's VMs once; find a VM named {plan.vm_name} "
            f"or probe from {vmid}; check that template {plan.template_vmid} is a template "
            "without a cloud-init drive",
        ),
        PlanStep(
            "clone",
            f"full clone of template {plan.template_vmid} to {vmid} on node {plan.node} "
            f"({where}), the mark in its description; wait for the qmclone task",
        ),
        PlanStep(
            "upload",
            f"build the NoCloud seed and upload it as {plan.seed_iso_name} to "
            f"{plan.iso_storage} on {plan.node}, overwriting; wait for the imgcopy task",
        ),
        PlanStep(
            "configure",
            "one config write: "
            + ", ".join(sorted(plan.configure))
            + (", net0" if plan.rewrites_net0 else ""),
        ),
    ]
    if plan.disk_gib is not None:
        steps.append(
            PlanStep(
                "resize",
                f"grow the boot disk to {plan.disk_gib} GiB when it is smaller; wait for the "
                "resize task",
            )
        )
    steps += [
        PlanStep("start", "start the VM unless it already runs; wait for the qmstart task"),
        PlanStep("running", "read the VM's status until QEMU reports it running"),
        PlanStep(
            "address",
            "poll the guest agent until it reports an IPv4 address"
            + (
                " (the seed's vendor-data installs the agent)"
                if plan.install_guest_agent
                else " (the template must ship the agent)"
            ),
        ),
    ]
    if not plan.keep_seed_iso:
        steps.append(
            PlanStep(
                "seed_release",
                f"eject {plan.seed_iso_name} from the VM and delete it from {plan.iso_storage} "
                "(it holds the user-data; the boot that read it is over)",
            )
        )
    return tuple(steps)
