"""A Proxmox cluster's configuration (seed 000 entry 15).

``ProxmoxConfig`` is what the provider needs to know about one cluster. It is built by the
Django side from a ``Cluster`` row, or from a catalogue document that uses the seed's own keys
(``from_mapping``); both paths end in the same ``validate`` rules, so a value refused on import
is refused for a row too. Every problem is collected, each under its path and with what is
allowed, so an operator fixes a document in one pass.

Values are checked before any Proxmox call because they end up in request paths (node names,
storage ids), in property strings (bridge) and in the VMID allocator (the range). A proxy's
placement is resolved against a config by ``placement.py`` (entry 3).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .build_inputs import (
    DISK_DEVICES,
    DISK_GIB_MAX,
    DISK_GIB_MIN,
    GUEST_USER,
    TEMPLATE_VERSION,
)

# Entry 15: node names as Proxmox knows them (they are request path segments).
_NODE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
# Cluster names and catalogue keys: DNS-label-like, so they read well in paths and admin URLs.
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_LABEL_MAX = 63
# pve-reference §5.1 ``pve-storage-id``: at least 2 characters, case-insensitive. Stricter than
# the seed's ``^[a-zA-Z][a-zA-Z0-9_.-]*$``, which would let through ids Proxmox refuses.
_STORAGE_ID = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE)
# pve-reference §5.3 ``pve-bridge-id``; also keeps ``,`` and ``=`` out of the net0 string.
_BRIDGE = re.compile(r"[-_.A-Za-z0-9]+")
# The installation id is one line of the description mark (marks.py): no spaces, no '='.
_INSTALLATION_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

VMID_FLOOR = 100
VMID_CEILING = 999_999_999
VLAN_MIN, VLAN_MAX = 1, 4094
# pve-reference §5.6 / schema: ``memory`` has a minimum of 16 MiB. The seed only asks for
# "above zero", but a smaller value would be refused by Proxmox after the clone exists.
MEMORY_MIB_MIN = 16
CATALOGUE_MAX = 128

_LABEL_RULE = "lower-case letters, digits and inner hyphens, at most 63 characters"
_STORAGE_RULE = (
    "a Proxmox storage id (a letter, then letters, digits, '-', '_' or '.', ending in a "
    "letter or digit)"
)

# pve-access-control ``verify_poolname`` (schema format ``pve-poolid``), one level only: a
# nested pool name would need ACLs on each parent, which the bootstrap does not make.
_POOL = re.compile(r"[A-Za-z0-9.\-_]{1,64}")
_POOL_RULE = "a Proxmox pool id (letters, digits, '.', '-' or '_', at most 64 characters)"

_TOP_KEYS = (
    "name",
    "url",
    "tokenFile",
    "caFile",
    "insecureSkipTLSVerify",
    "nodes",
    "isoStorage",
    "storage",
    "bridge",
    "vlanTag",
    "pool",
    "vmidRange",
    "templates",
    "machineTypes",
    "requestTimeoutSeconds",
    "vendorData",
    "installGuestAgent",
    "driftPolicy",
)
_REQUIRED_KEYS = ("name", "url", "tokenFile", "nodes", "isoStorage", "templates", "machineTypes")
_RANGE_KEYS = ("min", "max")
# Issue 14: what reconcile does about a proxy VM whose cores, memory or net0 differ from the
# catalogue: show it (``report``), or also set them back (``repair``, ``services.reconcile``).
DRIFT_POLICIES = ("report", "repair")
_TEMPLATE_KEYS = (
    "vmid",
    "templateVersion",
    "diskDevice",
    "sourceDiskGiB",
    "guestUser",
    "copies",
    "waitForCloudInit",
)
_MACHINE_KEYS = ("cores", "memoryMiB", "diskGiB")
# Values never echoed in an error: vendor-data is guest configuration and may hold secrets.
_SECRET_PATHS = frozenset({"vendorData"})


@dataclass(frozen=True)
class FieldError:
    """One problem: where (``machineTypes.small.cores``) and what is allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(ValueError):
    """A configuration with one or more problems; ``errors`` lists every one."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "; ".join(str(e) for e in self.errors)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[FieldError]]]:
        return (ConfigError, (self.errors,))


@dataclass(frozen=True)
class MachineType:
    """A catalogue size: vCPUs, memory and, optionally, the boot disk to grow to."""

    cores: int
    memory_mib: int
    disk_gib: int | None = None


@dataclass(frozen=True)
class TemplateRef:
    """A catalogue image: the VMID of a Proxmox template to full-clone, and what seed 003 asks a
    template declaration to carry (``templateVersion``, ``diskDevice``, ``sourceDiskGiB``,
    ``guestUser``; optional, so catalogues written before issue 14 still load).

    ``copies`` (issue 14): per-node copies of a template on local storage, node → VMID, built by
    ``templates build --all-nodes``; a create on such a node clones its copy, so clones need
    not queue on one node nor cross nodes from local storage.

    ``wait_for_cloud_init`` (seed 003's readiness, issue 14): a VM of this image counts as
    Running only once cloud-init has reported done in the guest, not when its address appears.
    """

    vmid: int
    template_version: str | None = None
    disk_device: str | None = None
    source_disk_gib: int | None = None
    guest_user: str | None = None
    copies: Mapping[str, int] = field(default_factory=dict, hash=False)
    wait_for_cloud_init: bool = False

    def vmid_on(self, node: str) -> int:
        """The template to clone for a VM on ``node``: its copy there, else the template."""
        return int(self.copies.get(node, self.vmid)) if node else self.vmid


def _show(value: object) -> str:
    """A value as an operator would have typed it, cut short; never a whole document."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 80 else value[:80] + "...")
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a map"
    return type(value).__name__


def _is_int(value: object) -> bool:
    # bool is an int in Python but never a count or an id in a catalogue.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ProxmoxConfig:
    """One Proxmox cluster, entry 15's block plus its name and the installation id.

    ``request_timeout_seconds`` of 0 means no per-request limit (the seed's
    ``http.Client.Timeout`` semantics); ``vendor_data`` is joined into the seed ISO's
    vendor-data; ``installation_id`` goes into every VM's mark (DESIGN §2).

    Neither of the last two is a catalogue key; the Django side sets them from its settings and
    the cluster row: ``credentials_dir`` is the only directory ``token_file`` and ``ca_file``
    may be read from (``credentials.read_confined``; ``None``: unconfined, for the client used
    on its own), ``ca_fingerprint`` the SHA-256 of the CA trusted for ``url``
    (``credentials.ca_fingerprint``; ``None``: nothing recorded yet).
    """

    name: str
    url: str
    token_file: str
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False
    nodes: tuple[str, ...] = ()
    iso_storage: str = ""
    storage: str | None = None
    bridge: str | None = None
    vlan_tag: int | None = None
    # Issue 14: the resource pool every clone joins (``bootstrap_cluster`` makes it); its ACL
    # is what gives proxyhub's token its rights on the proxy VMs.
    pool: str | None = None
    vmid_min: int = 100000
    vmid_max: int = 199999
    templates: Mapping[str, TemplateRef] = field(default_factory=dict)
    machine_types: Mapping[str, MachineType] = field(default_factory=dict)
    request_timeout_seconds: float = 30.0
    vendor_data: str | None = None
    install_guest_agent: bool = True
    drift_policy: str = "report"
    installation_id: str = ""
    credentials_dir: str | None = None
    ca_fingerprint: str | None = None

    def __post_init__(self) -> None:
        # Detach from the caller's containers so later edits to them cannot change a config.
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "templates", dict(self.templates))
        object.__setattr__(self, "machine_types", dict(self.machine_types))

    # --- building from and exporting to the seed's keys ------------------------------

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, object], *, installation_id: str, prefix: str = ""
    ) -> ProxmoxConfig:
        """Build from the seed's keys plus ``name``; raise ``ConfigError`` listing every problem.

        Unknown keys are refused at every level (a typo such as ``vlanTags`` would otherwise
        silently leave the VLAN unset). ``null`` counts as absent. Paths in errors start with
        ``prefix`` (for example ``clusters[0].``).
        """
        if not isinstance(data, Mapping):
            where = prefix.rstrip(".") or "(document)"
            raise ConfigError([FieldError(where, f"must be a map of settings, got {_show(data)}")])
        structural: list[FieldError] = []

        def fail(path: str, message: str) -> None:
            structural.append(FieldError(path, message))

        _refuse_unknown(data, _TOP_KEYS, "", fail)
        for key in _REQUIRED_KEYS:
            if data.get(key) is None:
                fail(key, "is required")

        kwargs: dict[str, Any] = {"installation_id": installation_id}
        simple = {
            "name": "name",
            "url": "url",
            "tokenFile": "token_file",
            "caFile": "ca_file",
            "insecureSkipTLSVerify": "insecure_skip_tls_verify",
            "isoStorage": "iso_storage",
            "storage": "storage",
            "bridge": "bridge",
            "vlanTag": "vlan_tag",
            "pool": "pool",
            "vendorData": "vendor_data",
            "installGuestAgent": "install_guest_agent",
            "driftPolicy": "drift_policy",
        }
        for key, attr in simple.items():
            if data.get(key) is not None:
                kwargs[attr] = data[key]
        for attr in ("name", "url", "token_file"):
            kwargs.setdefault(attr, "")  # missing: reported above as required

        nodes = data.get("nodes")
        if isinstance(nodes, list | tuple):
            kwargs["nodes"] = tuple(nodes)
        elif nodes is not None:
            fail("nodes", f"must be a list of node names, got {_show(nodes)}")

        timeout = data.get("requestTimeoutSeconds")
        if timeout is not None:
            if isinstance(timeout, int) and not isinstance(timeout, bool):
                timeout = float(timeout)
            kwargs["request_timeout_seconds"] = timeout

        vmid_range = data.get("vmidRange")
        if isinstance(vmid_range, Mapping):
            _refuse_unknown(vmid_range, _RANGE_KEYS, "vmidRange.", fail)
            if vmid_range.get("min") is not None:
                kwargs["vmid_min"] = vmid_range["min"]
            if vmid_range.get("max") is not None:
                kwargs["vmid_max"] = vmid_range["max"]
        elif vmid_range is not None:
            fail("vmidRange", f"must be a map with min and max, got {_show(vmid_range)}")

        kwargs["templates"] = _entries(
            data.get("templates"),
            "templates",
            _TEMPLATE_KEYS,
            ("vmid",),
            lambda e: TemplateRef(
                vmid=e["vmid"],
                template_version=e.get("templateVersion"),
                disk_device=e.get("diskDevice"),
                source_disk_gib=e.get("sourceDiskGiB"),
                guest_user=e.get("guestUser"),
                copies=e.get("copies") or {},
                wait_for_cloud_init=e.get("waitForCloudInit", False),
            ),
            fail,
        )
        kwargs["machine_types"] = _entries(
            data.get("machineTypes"),
            "machineTypes",
            _MACHINE_KEYS,
            ("cores", "memoryMiB"),
            lambda e: MachineType(
                cores=e["cores"], memory_mib=e["memoryMiB"], disk_gib=e.get("diskGiB")
            ),
            fail,
        )

        config = cls(**kwargs)
        errors = structural + [
            rule for rule in config.problems() if not _covered(rule.path, structural)
        ]
        if errors:
            errors.sort(key=_document_order)
            raise ConfigError([FieldError(prefix + e.path, e.message) for e in errors])
        return config

    def to_mapping(self) -> dict[str, object]:
        """The seed's keys plus ``name``, as ``from_mapping`` reads them (for export).

        Unset optional values are left out; defaults are written out, so an exported document
        says exactly what the cluster uses.
        """
        out: dict[str, object] = {"name": self.name, "url": self.url, "tokenFile": self.token_file}
        if self.ca_file is not None:
            out["caFile"] = self.ca_file
        out["insecureSkipTLSVerify"] = self.insecure_skip_tls_verify
        out["nodes"] = list(self.nodes)
        out["isoStorage"] = self.iso_storage
        for key, value in (
            ("storage", self.storage),
            ("bridge", self.bridge),
            ("vlanTag", self.vlan_tag),
            ("pool", self.pool),
        ):
            if value is not None:
                out[key] = value
        out["vmidRange"] = {"min": self.vmid_min, "max": self.vmid_max}
        out["templates"] = {key: _template_mapping(ref) for key, ref in self.templates.items()}
        machine_types: dict[str, object] = {}
        for key, mt in self.machine_types.items():
            entry: dict[str, int] = {"cores": mt.cores, "memoryMiB": mt.memory_mib}
            if mt.disk_gib is not None:
                entry["diskGiB"] = mt.disk_gib
            machine_types[key] = entry
        out["machineTypes"] = machine_types
        timeout = self.request_timeout_seconds
        out["requestTimeoutSeconds"] = int(timeout) if float(timeout).is_integer() else timeout
        if self.vendor_data is not None:
            out["vendorData"] = self.vendor_data
        out["installGuestAgent"] = self.install_guest_agent
        out["driftPolicy"] = self.drift_policy
        return out

    # --- rules -------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ``ConfigError`` listing every rule of entry 15 this config breaks."""
        errors = self.problems()
        if errors:
            raise ConfigError(errors)

    def problems(self) -> list[FieldError]:
        """Every broken rule, with the seed's key paths; empty when the config is good."""
        errors: list[FieldError] = []

        def bad(path: str, expected: str, value: object) -> None:
            shown = "a hidden value" if path in _SECRET_PATHS else _show(value)
            errors.append(FieldError(path, f"must be {expected}, got {shown}"))

        if not (isinstance(self.name, str) and _is_label(self.name)):
            bad("name", f"a cluster name ({_LABEL_RULE})", self.name)
        url_problem = _url_problem(self.url)
        if url_problem:
            errors.append(FieldError("url", url_problem))
        if not (isinstance(self.token_file, str) and self.token_file.strip()):
            bad("tokenFile", "a non-empty file path", self.token_file)
        if self.ca_file is not None and not (
            isinstance(self.ca_file, str) and self.ca_file.strip()
        ):
            bad("caFile", "a non-empty file path when set", self.ca_file)
        if not isinstance(self.insecure_skip_tls_verify, bool):
            bad("insecureSkipTLSVerify", "true or false", self.insecure_skip_tls_verify)

        if not self.nodes:
            errors.append(FieldError("nodes", "must list at least one node"))
        first_seen: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            path = f"nodes[{index}]"
            if not (isinstance(node, str) and _NODE.fullmatch(node)):
                bad(path, "a node name (lower-case letters, digits and inner hyphens)", node)
            elif node in first_seen:
                errors.append(
                    FieldError(path, f"duplicates nodes[{first_seen[node]}] ({_show(node)})")
                )
            else:
                first_seen[node] = index

        if not (isinstance(self.iso_storage, str) and _STORAGE_ID.fullmatch(self.iso_storage)):
            bad("isoStorage", _STORAGE_RULE, self.iso_storage)
        if self.storage is not None and not (
            isinstance(self.storage, str) and _STORAGE_ID.fullmatch(self.storage)
        ):
            bad("storage", _STORAGE_RULE + " when set", self.storage)
        if self.bridge is not None and not (
            isinstance(self.bridge, str) and _BRIDGE.fullmatch(self.bridge)
        ):
            bad("bridge", "a bridge name (letters, digits, '-', '_' or '.') when set", self.bridge)
        if self.vlan_tag is not None and not (
            _is_int(self.vlan_tag) and VLAN_MIN <= self.vlan_tag <= VLAN_MAX
        ):
            bad("vlanTag", f"an integer from {VLAN_MIN} to {VLAN_MAX} when set", self.vlan_tag)
        if self.pool is not None and not (
            isinstance(self.pool, str) and _POOL.fullmatch(self.pool)
        ):
            bad("pool", _POOL_RULE + " when set", self.pool)

        range_ok = True
        if not (_is_int(self.vmid_min) and VMID_FLOOR <= self.vmid_min <= VMID_CEILING):
            bad("vmidRange.min", f"an integer from {VMID_FLOOR} to {VMID_CEILING}", self.vmid_min)
            range_ok = False
        if not (_is_int(self.vmid_max) and VMID_FLOOR <= self.vmid_max <= VMID_CEILING):
            bad("vmidRange.max", f"an integer from {VMID_FLOOR} to {VMID_CEILING}", self.vmid_max)
            range_ok = False
        if range_ok and self.vmid_min >= self.vmid_max:
            errors.append(
                FieldError(
                    "vmidRange",
                    f"min must be below max, got min {self.vmid_min} and max {self.vmid_max}",
                )
            )

        self._catalogue_problems("templates", "template", self.templates, TemplateRef, errors)
        for key, ref in self.templates.items():
            if isinstance(ref, TemplateRef) and not (
                _is_int(ref.vmid) and VMID_FLOOR <= ref.vmid <= VMID_CEILING
            ):
                bad(
                    f"templates.{key}.vmid",
                    f"an integer from {VMID_FLOOR} to {VMID_CEILING}",
                    ref.vmid,
                )

            elif isinstance(ref, TemplateRef):
                for path, message, value in _declaration_problems(ref, self.nodes):
                    bad(f"templates.{key}.{path}", message, value)

        self._catalogue_problems(
            "machineTypes", "machine type", self.machine_types, MachineType, errors
        )
        for key, mt in self.machine_types.items():
            if not isinstance(mt, MachineType):
                continue
            if not (_is_int(mt.cores) and mt.cores >= 1):
                bad(f"machineTypes.{key}.cores", "an integer of at least 1", mt.cores)
            if not (_is_int(mt.memory_mib) and mt.memory_mib >= MEMORY_MIB_MIN):
                bad(
                    f"machineTypes.{key}.memoryMiB",
                    f"an integer of at least {MEMORY_MIB_MIN}",
                    mt.memory_mib,
                )
            if mt.disk_gib is not None and not (_is_int(mt.disk_gib) and mt.disk_gib >= 0):
                bad(
                    f"machineTypes.{key}.diskGiB",
                    "an integer of at least 0 when set",
                    mt.disk_gib,
                )

        timeout = self.request_timeout_seconds
        if not (
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout >= 0
        ):
            bad("requestTimeoutSeconds", "a number of seconds of at least 0", timeout)
        if self.vendor_data is not None and not isinstance(self.vendor_data, str):
            bad("vendorData", "text when set", self.vendor_data)
        if not isinstance(self.install_guest_agent, bool):
            bad("installGuestAgent", "true or false", self.install_guest_agent)
        if self.drift_policy not in DRIFT_POLICIES:
            bad("driftPolicy", " or ".join(DRIFT_POLICIES), self.drift_policy)
        if not (
            isinstance(self.installation_id, str)
            and _INSTALLATION_ID.fullmatch(self.installation_id)
        ):
            bad(
                "installationId",
                "1 to 64 letters, digits, '.', '_' or '-' (set by proxyhub, not the catalogue)",
                self.installation_id,
            )
        return errors

    @staticmethod
    def _catalogue_problems(
        path: str,
        what: str,
        entries: Mapping[str, object],
        kind: type,
        errors: list[FieldError],
    ) -> None:
        if not entries:
            errors.append(FieldError(path, f"must hold at least one {what}"))
        elif len(entries) > CATALOGUE_MAX:
            errors.append(
                FieldError(path, f"must hold at most {CATALOGUE_MAX} entries, got {len(entries)}")
            )
        for key, entry in entries.items():
            if not (isinstance(key, str) and _is_label(key)):
                errors.append(FieldError(f"{path}.{key}", f"the key must be {_LABEL_RULE}"))
            if not isinstance(entry, kind):
                errors.append(FieldError(f"{path}.{key}", f"must be a {kind.__name__}"))


# --- helpers --------------------------------------------------------------------------------


def _template_mapping(ref: TemplateRef) -> dict[str, object]:
    out: dict[str, object] = {"vmid": ref.vmid}
    for key, value in (
        ("templateVersion", ref.template_version),
        ("diskDevice", ref.disk_device),
        ("sourceDiskGiB", ref.source_disk_gib),
        ("guestUser", ref.guest_user),
    ):
        if value is not None:
            out[key] = value
    if ref.copies:
        out["copies"] = dict(ref.copies)
    if ref.wait_for_cloud_init:
        out["waitForCloudInit"] = True
    return out


def _declaration_problems(
    ref: TemplateRef, nodes: tuple[str, ...]
) -> list[tuple[str, str, object]]:
    """Seed 003's limits on a template declaration's fields, as (path, allowed, value)."""
    out: list[tuple[str, str, object]] = []
    version = ref.template_version
    if version is not None and not (
        isinstance(version, str) and TEMPLATE_VERSION.fullmatch(version)
    ):
        out.append(
            (
                "templateVersion",
                "1-128 letters, digits, dots, underscores, plus signs or hyphens",
                version,
            )
        )
    if ref.disk_device is not None and ref.disk_device not in DISK_DEVICES:
        out.append(("diskDevice", f"one of {', '.join(DISK_DEVICES)}", ref.disk_device))
    size = ref.source_disk_gib
    if size is not None and not (_is_int(size) and DISK_GIB_MIN <= size <= DISK_GIB_MAX):
        out.append(("sourceDiskGiB", f"an integer from {DISK_GIB_MIN} to {DISK_GIB_MAX}", size))
    user = ref.guest_user
    if user is not None and not (
        isinstance(user, str) and GUEST_USER.fullmatch(user) and user != "root"
    ):
        out.append(
            (
                "guestUser",
                "1-32 lower-case letters, digits, underscores or hyphens, starting with a "
                "letter or underscore, not root",
                user,
            )
        )
    if not isinstance(ref.wait_for_cloud_init, bool):
        out.append(("waitForCloudInit", "true or false", ref.wait_for_cloud_init))
    if not isinstance(ref.copies, Mapping):
        out.append(("copies", "a map of node name to template VMID", ref.copies))
        return out
    for node, vmid in ref.copies.items():
        if node not in nodes:
            out.append((f"copies.{node}", "a node of this cluster", node))
        elif not (_is_int(vmid) and VMID_FLOOR <= vmid <= VMID_CEILING):
            out.append((f"copies.{node}", f"an integer from {VMID_FLOOR} to {VMID_CEILING}", vmid))
    return out


def _is_label(text: str) -> bool:
    return len(text) <= _LABEL_MAX and _LABEL.fullmatch(text) is not None


def _url_problem(url: object) -> str | None:
    """Entry 15: an ``https`` URL with a host and no path other than ``/``."""
    expected = "an https URL with a host and no path other than /, such as https://pve1:8006"
    if not isinstance(url, str) or not url:
        return f"must be {expected}, got {_show(url)}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return f"must be {expected}, got {_show(url)}"
    if parts.username is not None or parts.password is not None:
        # Never echo it: the user part may hold a password.
        return "must not carry a user or password; the API token comes from tokenFile"
    if (
        parts.scheme != "https"
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        return f"must be {expected}, got {_show(url)}"
    return None


def _refuse_unknown(
    data: Mapping[Any, object],
    allowed: tuple[str, ...],
    path: str,
    fail: Callable[[str, str], None],
) -> None:
    for key in data:
        if key not in allowed:
            fail(f"{path}{key}", f"is not a known key; allowed: {', '.join(allowed)}")


def _entries(
    raw: object,
    path: str,
    allowed: tuple[str, ...],
    required: tuple[str, ...],
    build: Callable[[Mapping[str, Any]], Any],
    fail: Callable[[str, str], None],
) -> dict[str, Any]:
    """A catalogue map (``templates`` or ``machineTypes``) with its entries' structure checked.

    Entries whose structure is wrong are reported here and left out; the value rules then run
    on the rest, so one broken entry does not hide another's problems.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        fail(path, f"must be a map of key to settings, got {_show(raw)}")
        return {}
    out: dict[str, Any] = {}
    for key, entry in raw.items():
        if not isinstance(key, str):
            fail(f"{path}.{key}", f"the key must be text ({_LABEL_RULE})")
            continue
        entry_path = f"{path}.{key}"
        if not isinstance(entry, Mapping):
            fail(entry_path, f"must be a map with {', '.join(allowed)}, got {_show(entry)}")
            continue
        _refuse_unknown(entry, allowed, entry_path + ".", fail)
        missing = [k for k in required if entry.get(k) is None]
        for k in missing:
            fail(f"{entry_path}.{k}", "is required")
        if not missing:
            out[key] = build(entry)
    return out


def _covered(path: str, structural: list[FieldError]) -> bool:
    """Whether a structural error already explains a rule's complaint at ``path``.

    A missing key is reported once as "is required", not again as an empty value; a broken
    entry of ``templates`` silences "must hold at least one template".
    """
    for err in structural:
        other = err.path
        if other == path or other.startswith((path + ".", path + "[")):
            return True
        if path.startswith((other + ".", other + "[")):
            return True
    return False


def _document_order(err: FieldError) -> int:
    """Errors grouped by key in the seed's order (the sort is stable within a key)."""
    head = re.split(r"[.\[]", err.path, maxsplit=1)[0]
    return _TOP_KEYS.index(head) if head in _TOP_KEYS else len(_TOP_KEYS)
