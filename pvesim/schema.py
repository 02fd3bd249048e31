"""Route lookup and parameter verification driven by Proxmox's own API schema.

The simulator must be strict exactly where Proxmox is strict (DESIGN.md §7a), so instead of
hand-written checks per endpoint it reads the official schema (pve-docs ``apidata.js``, vendored
under ``data/``) and re-implements pve-common ``JSONSchema.pm``'s ``validate``: the same checks,
in the same order, with the same texts (pve-reference §1.1, §1.3, §5).

What it reproduces:

* missing required parameters, unknown parameters (``additionalProperties: 0``), ``requires``;
* per value, in this order, the first failure winning: type → format → pattern → maxLength →
  minLength → minimum/maximum → enum;
* form encoding rules: booleans only ``1``/``0``, integers ``[+-]?\\d+``; JSON bodies may also
  carry real booleans and numbers, and arrays for ``*-list`` formats (joined with ``,``);
* named ``format`` validators with Proxmox's messages (``invalid format - <text>\\n``);
* property strings (``net0``, ``scsi0``, ``agent``, ``memory``, ...): pve-common
  ``parse_property_string`` with default keys and key aliases (``virtio=<MAC>`` sets
  ``model``), then the nested keys are checked like parameters;
* indexed keys: the schema lists ``net[n]``; ``net0`` … ``net31`` match it.

Formats whose exact upstream text could not be confirmed are checked with a plausible text and
marked so below; formats nothing in scope depends on are accepted without a check.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_FILES = (DATA_DIR / "endpoints.json", DATA_DIR / "extra-endpoints.json")

# Texts of pve-common JSONSchema.pm (pve-reference §1.3).
MISSING = "property is missing and it is not optional"
NOT_DEFINED = (
    "property is not defined in schema and the schema does not allow additional properties"
)
PATTERN_FAILED = "value does not match the regex pattern"

# Highest index of each indexed key (``net[n]`` → net0 … net31). Descriptions state some of
# them ("n is 0 to 30"); the rest are qemu-server / pve-container constants (MAX_NETS = 32,
# MAX_UNUSED_DISKS = 256, MAX_HOSTPCI_DEVICES = 16, MAX_NUMA = 8, MAX_USB_DEVICES = 14,
# MAX_VIRTIOFS = 10, LXC: MAX_LXC_NETWORKS = 32, MAX_MOUNT_POINTS = 256, MAX_DEVICES = 256).
_INDEX_MAX = {
    "net": 31,
    "ipconfig": 31,
    "unused": 255,
    "hostpci": 15,
    "numa": 7,
    "usb": 13,
    "virtiofs": 9,
    "mp": 255,
    "dev": 255,
}
_INDEX_FROM_DESCRIPTION = re.compile(r"\(n is 0 to (\d+)")


class FormatError(Exception):
    """A format validator's ``die`` text, without the ``invalid format - `` prefix."""


@dataclass(frozen=True)
class RouteMatch:
    """A request path resolved to a schema entry."""

    key: str  # "GET /nodes/{node}/qemu/{vmid}/config"
    path_params: dict[str, str]  # {"node": "pve1", "vmid": "100"} (percent-decoded)


# --- values as JSONSchema.pm sees them ------------------------------------------------------


class _JsonBool:
    """A real JSON boolean from a JSON body: valid for ``boolean`` parameters only.

    In Perl it is a ``JSON::PP::Boolean`` reference, which ``check_type`` accepts for booleans
    (pve-reference §1.1) and reports by its class name for every other type.
    """

    def __init__(self, value: bool) -> None:
        self.value = value


_Value = str | _JsonBool


def _perl_num(value: object) -> str:
    """A schema number as Perl prints it in messages (``100``, ``0.5``, ``'0'`` → ``0``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else format(value, ".15g")
    return str(value)


_INTEGER_RE = re.compile(r"[+-]?\d+\Z")
_NUMBER_RE = re.compile(r"[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?\Z")


def _is_integer(value: str) -> bool:
    return _INTEGER_RE.match(value) is not None


def _is_number(value: str) -> bool:
    return _NUMBER_RE.match(value) is not None


def split_list(text: str) -> list[str]:
    """pve-common ``split_list``: entries separated by ``,``, ``;`` or whitespace."""
    if "\0" in text:
        return text.split("\0")
    return re.sub(r"[,;]", " ", text).split()


def _perl_regex(pattern: str) -> re.Pattern[str]:
    """Compile a schema ``pattern`` (Perl syntax) anchored the way ``m/^$pattern$/`` is."""
    python = pattern.replace("(?^:", "(?:")
    # Python's ``$`` also matches before a final newline, exactly like Perl's.
    return re.compile(f"^(?:{python})$")


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str]:
    return _perl_regex(pattern)


# --- named format validators (pve-common JSONSchema.pm and the packages that register more) ---

_NODE_RE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?\Z")
_VMID_RE = re.compile(r"[1-9][0-9]{2,8}\Z")
_STORAGE_ID_RE = re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]\Z", re.IGNORECASE)
_CONFIGID_RE = re.compile(r"[a-z][a-z0-9_-]+\Z", re.IGNORECASE)
_DNS_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?"
_DNS_NAME_RE = re.compile(rf"({_DNS_LABEL}\.)*{_DNS_LABEL}\Z")
_TAG_RE = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*\Z", re.IGNORECASE)
_MAC_RE = re.compile(r"[a-f0-9][02468ace](:[a-f0-9]{2}){5}\Z", re.IGNORECASE)
_BRIDGE_RE = re.compile(r"[-_.\w\d]+\Z")
_VOLUME_ID_RE = re.compile(r"([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)\Z", re.IGNORECASE | re.DOTALL)
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:[KMGT](?:iB)?)?\Z")
_POOL_RE = re.compile(r"[A-Za-z0-9.\-_]+(/[A-Za-z0-9.\-_]+){0,2}\Z")
_URLENCODED_RE = re.compile(r"[-%a-zA-Z0-9_.!~*'()]*\Z")
_STARTUP_PART_RE = re.compile(r"(?:(?:order=)?\d+|up=\d+|down=\d+)\Z")
_REALM_RE = re.compile(r"[A-Za-z][A-Za-z0-9.\-_]+\Z")
_BOOTDISK_RE = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate)\d+\Z")
_HOTPLUG_FEATURES = frozenset({"network", "disk", "cpu", "memory", "usb", "cloudinit"})
_STORAGE_CONTENT = frozenset(
    {"images", "rootdir", "vztmpl", "iso", "backup", "snippets", "import", "none"}
)
_TASK_STATUS_TYPES = frozenset({"ok", "error", "warning", "unknown"})


def _verify_vmid(value: str) -> None:
    if not _VMID_RE.match(value):
        raise FormatError("value does not look like a valid VM ID")


def _verify_node(value: str) -> None:
    if not _NODE_RE.match(value):
        raise FormatError("value does not look like a valid node name")


def _verify_storage_id(value: str) -> None:
    if len(value) < 2:
        raise FormatError(f"storage ID '{value}' cannot be shorter than 2 characters")
    if not _STORAGE_ID_RE.match(value):
        raise FormatError(f"storage ID '{value}' contains illegal characters")


def _verify_configid(value: str) -> None:
    if not _CONFIGID_RE.match(value):
        raise FormatError(f"invalid configuration ID '{value}'")


def _verify_dns_name(value: str) -> None:
    if not _DNS_NAME_RE.match(value):
        raise FormatError("value does not look like a valid DNS name")


def _verify_tag(value: str) -> None:
    if not _TAG_RE.match(value):
        raise FormatError("invalid characters in tag")


def _verify_mac(value: str) -> None:
    if not _MAC_RE.match(value):
        raise FormatError("value does not look like a valid unicast MAC address")


def _verify_bridge(value: str) -> None:
    # qemu-server Network.pm parse_bridge_id (text not confirmed against a live server).
    if not _BRIDGE_RE.match(value):
        raise FormatError(f"invalid bridge ID '{value}'")


def _verify_volume_id(value: str) -> None:
    if not _VOLUME_ID_RE.match(value):
        raise FormatError(f"unable to parse volume ID '{value}'")


def _verify_volume_id_or_qm_path(value: str) -> None:
    """qemu-server ``verify_volume_id_or_qm_path``: ``none``, ``cdrom``, a path or a volid.

    Loose on purpose: the allocation syntax ``local-lvm:32`` is a volid to this check too.
    """
    if value in ("none", "cdrom") or value.startswith("/"):
        return
    _verify_volume_id(value)


def _verify_volume_id_or_absolute_path(value: str) -> None:
    if value.startswith("/"):
        return
    _verify_volume_id(value)


def _verify_disk_size(value: str) -> None:
    if not _SIZE_RE.match(value):
        raise FormatError(f"value '{value}' does not look like a valid disk size")


def _verify_poolid(value: str) -> None:
    # pve-access-control verify_poolname (text not confirmed against a live server).
    if not _POOL_RE.match(value):
        raise FormatError(f"pool name '{value}' contains invalid characters")


def _verify_urlencoded(value: str) -> None:
    if not _URLENCODED_RE.match(value):
        raise FormatError(f"invalid urlencoded string: {value}")


def _verify_startup(value: str) -> None:
    parts = [p for p in value.split(",") if p.strip()]
    if not all(_STARTUP_PART_RE.match(p.strip()) for p in parts):
        raise FormatError("unable to parse startup options")


def _verify_storage_content(value: str) -> None:
    if value not in _STORAGE_CONTENT:
        raise FormatError(f"invalid content type '{value}'")


def _verify_task_status(value: str) -> None:
    if value not in _TASK_STATUS_TYPES:
        raise FormatError(f"invalid task status type '{value}'")


def _verify_realm(value: str) -> None:
    if not _REALM_RE.match(value):
        raise FormatError("value does not look like a valid realm")


def _verify_bootdisk(value: str) -> None:
    if not _BOOTDISK_RE.match(value):
        raise FormatError(f"invalid boot disk '{value}'")


def _verify_hotplug(value: str) -> None:
    if value in ("0", "1"):
        return
    for feature in value.split(","):
        if feature not in _HOTPLUG_FEATURES:
            raise FormatError(f"invalid hotplug feature '{feature}'")


def _verify_ipv4(value: str) -> None:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise FormatError("value does not look like a valid IPv4 address") from None


def _verify_ipv6(value: str) -> None:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        raise FormatError("value does not look like a valid IPv6 address") from None


def _verify_ip(value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise FormatError("value does not look like a valid IP address") from None


def _verify_cidr(value: str) -> None:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise FormatError("value does not look like a valid CIDR network") from None
    if "/" not in value:
        raise FormatError("value does not look like a valid CIDR network")


def _verify_ip_config(family: str) -> Callable[[str], None]:
    """``pve-ipv4-config`` / ``pve-ipv6-config``: ``dhcp``/``manual`` (``auto`` for v6) or CIDR."""
    keywords = {"dhcp", "manual"} | ({"auto"} if family == "6" else set())

    def verify(value: str) -> None:
        if value in keywords:
            return
        try:
            network = ipaddress.ip_interface(value)
        except ValueError:
            network = None
        if network is None or str(network.version) != family or "/" not in value:
            raise FormatError(f"value does not look like a valid IPv{family} network configuration")

    return verify


def _each(verify: Callable[[str], None]) -> Callable[[str], None]:
    """A ``*-list`` format: every entry of ``split_list`` must pass ``verify``."""

    def verify_list(value: str) -> None:
        for entry in split_list(value):
            verify(entry)

    return verify_list


def _verify_address(value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise FormatError(f"value does not look like a valid address: {value}") from None


FORMAT_VALIDATORS: dict[str, Callable[[str], None]] = {
    "pve-vmid": _verify_vmid,
    "pve-node": _verify_node,
    "pve-storage-id": _verify_storage_id,
    "pve-configid": _verify_configid,
    "pve-configid-list": _each(_verify_configid),
    "dns-name": _verify_dns_name,
    "dns-name-list": _each(_verify_dns_name),
    "pve-tag-list": _each(_verify_tag),
    "mac-addr": _verify_mac,
    "pve-bridge-id": _verify_bridge,
    "pve-volume-id": _verify_volume_id,
    "pve-volume-id-or-qm-path": _verify_volume_id_or_qm_path,
    "pve-volume-id-or-absolute-path": _verify_volume_id_or_absolute_path,
    "disk-size": _verify_disk_size,
    "pve-poolid": _verify_poolid,
    "urlencoded": _verify_urlencoded,
    "pve-startup-order": _verify_startup,
    "pve-storage-content": _verify_storage_content,
    "pve-storage-content-list": _each(_verify_storage_content),
    "pve-task-status-type-list": _each(_verify_task_status),
    "pve-realm": _verify_realm,
    "pve-qm-bootdisk": _verify_bootdisk,
    "pve-hotplug-features": _verify_hotplug,
    "ipv4": _verify_ipv4,
    "ipv6": _verify_ipv6,
    "ip": _verify_ip,
    "CIDR": _verify_cidr,
    "address-list": _each(_verify_address),
    "pve-ipv4-config": _verify_ip_config("4"),
    "pve-ipv6-config": _verify_ip_config("6"),
}


# --- property strings ----------------------------------------------------------------------

_BOOLEAN_WORDS = {"1": "1", "true": "1", "yes": "1", "on": "1"}
_BOOLEAN_WORDS.update({"0": "0", "false": "0", "no": "0", "off": "0"})

# One entry of a property string's typetext: ``[,key=<value>]``, ``[[key=]<value>]``,
# ``key=<value>`` or ``[key=]<value>``; the value is ``<...>`` or a bare token.
_TYPETEXT_ENTRY = re.compile(
    r"(?P<open>\[?\[?),?(?P<key>[A-Za-z][\w-]*)=(?P<default>\])?(?P<value><[^>]*>|[^\s\]]+)"
)


@functools.lru_cache(maxsize=128)
def _format_from_typetext(typetext: str) -> dict[str, dict[str, Any]]:
    """A nested ``format`` for named property-string formats the viewer data does not expand.

    ``apidata.js`` expands most property strings (``net[n]``, ``agent``, ``memory``) but gives
    only the ``typetext`` for some named ones (``boot``, ``smbios1``, ``ipconfig[n]``, ``cpu``).
    The typetext names every key, which of them is the default key, and for many the value
    type (``<1|0>``, ``<integer>``, ``<a|b>``) — enough for Proxmox's key checks.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in _TYPETEXT_ENTRY.finditer(typetext):
        spec = m.group("value")
        inner = spec[1:-1] if spec.startswith("<") else spec
        entry: dict[str, Any] = {"type": "string"}
        # ``[key=]<v>``: the brackets only make the key name optional, the value is required;
        # ``[[key=]<v>]`` and ``[,key=<v>]`` are optional; a bare ``,key=<v>`` is required.
        if m.group("default"):
            entry["default_key"] = 1
            optional = m.group("open") == "[["
        else:
            optional = m.group("open") == "["
        if optional:
            entry["optional"] = 1
        if inner == "1|0":
            entry["type"] = "boolean"
        elif inner in ("integer", r"\d+"):
            entry["type"] = "integer"
        elif inner.startswith("["):
            entry["pattern"] = inner
        elif (
            "|" in inner
            and re.fullmatch(r"[\w./-]+(\|[\w./-]+)+", inner)
            and not re.search(r"\d-\d", inner)
        ):
            entry["enum"] = inner.split("|")
        out[m.group("key")] = entry
    return out


def parse_property_string(fmt: Mapping[str, Any], data: str) -> dict[str, str]:
    """pve-common ``parse_property_string``: split ``data`` into its keys.

    Raises ``FormatError`` with Proxmox's texts for syntax problems (unknown key, duplicate
    key, a value without a key when the format has no default key).
    """
    res: dict[str, str] = {}
    default_key: str | None = None
    for part in data.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"([^=]+)=(.+)", part, re.DOTALL)
        if m:
            key, value = m.group(1), m.group(2)
            if key in res:
                raise FormatError(f"duplicate key in comma-separated list property: {key}")
            schema = fmt.get(key)
            if schema is not None and schema.get("alias"):
                key_alias = schema.get("keyAlias")
                if key_alias:
                    # ``virtio=BC:24:...``: the key names the model, the value is the MAC.
                    if key_alias in res:
                        raise FormatError(f"key alias '{key}' is already defined")
                    res[key_alias] = key
                key = schema["alias"]
                schema = fmt.get(key)
            if schema is None:
                raise FormatError(f"invalid key in comma-separated list property: {key}")
            if schema.get("type") == "boolean":
                value = _BOOLEAN_WORDS.get(value.lower(), value)
            res[key] = value
        elif "=" not in part:
            if default_key is not None:
                raise FormatError(f"duplicate key in comma-separated list property: {default_key}")
            for key, schema in fmt.items():
                if schema.get("default_key"):
                    default_key = key
                    if res.get(key) not in (None, "", "0"):  # Perl truthiness
                        raise FormatError(
                            f"duplicate key in comma-separated list property: {default_key}"
                        )
                    res[key] = part
                    break
            if default_key is None:
                raise FormatError("value without key, but schema does not define a default key")
        else:
            raise FormatError("missing key in comma-separated list property")
    return res


# --- the checks of one value -----------------------------------------------------------------


def _add_error(errors: dict[str, str], path: str, message: str) -> None:
    # Several errors on one key are joined with the two characters backslash-n (§1.3).
    errors[path] = f"{errors[path]}\\n{message}" if path in errors else message


def _check_type(path: str, typ: str | None, value: _Value, errors: dict[str, str]) -> bool:
    if typ is None:
        return True
    if isinstance(value, _JsonBool):
        if typ == "boolean":
            return True
        _add_error(errors, path, f"type check ('{typ}') failed - got JSON::PP::Boolean")
        return False
    if typ == "boolean":
        ok = value in ("0", "1")
    elif typ == "integer":
        ok = _is_integer(value)
    elif typ == "number":
        ok = _is_number(value)
    else:
        ok = True
    if not ok:
        _add_error(errors, path, f"type check ('{typ}') failed - got '{value}'")
    return ok


def _check_format(fmt: object, typetext: str | None, value: str, path: str) -> None:
    """Raise ``FormatError`` with the text after ``invalid format - ``."""
    if isinstance(fmt, Mapping):
        _check_property_string(fmt, value, path)
        return
    if not isinstance(fmt, str):
        return
    validator = FORMAT_VALIDATORS.get(fmt)
    if validator is not None:
        try:
            validator(value)
        except FormatError as exc:
            raise FormatError(f"{exc}\n") from None
        return
    if typetext and "=" in typetext:
        _check_property_string(_format_from_typetext(typetext), value, path)


def _check_property_string(fmt: Mapping[str, Any], value: str, path: str) -> None:
    try:
        parsed = parse_property_string(fmt, value)
    except FormatError as exc:
        raise FormatError(f"{exc}\n") from None
    errors: dict[str, str] = {}
    for key, schema in fmt.items():
        if schema.get("alias"):
            continue
        _check_prop(parsed.get(key), schema, f"{path}.{key}", errors)
    for key in parsed:
        requires = fmt.get(key, {}).get("requires")
        if isinstance(requires, str) and requires not in parsed:
            _add_error(errors, f"{path}.{requires}", f"missing property required by '{key}'")
    if errors:
        # PVE::Exception stringified: the message, then one "path: text" line per error.
        lines = "".join(f"{k}: {errors[k]}\n" for k in sorted(errors))
        raise FormatError(f"format error\n{lines}")


def _check_prop(
    value: _Value | None, schema: Mapping[str, Any], path: str, errors: dict[str, str]
) -> None:
    """pve-common ``check_prop`` for one value: the first failing check wins."""
    if value is None:
        if not schema.get("optional") and not schema.get("alias"):
            _add_error(errors, path, MISSING)
        return
    if not _check_type(path, schema.get("type"), value, errors):
        return
    if isinstance(value, _JsonBool):
        return
    fmt = schema.get("format")
    if fmt is not None:
        try:
            _check_format(fmt, schema.get("typetext"), value, path)
        except FormatError as exc:
            _add_error(errors, path, f"invalid format - {exc}")
            return
    pattern = schema.get("pattern")
    if pattern is not None and not _compiled(pattern).match(value):
        _add_error(errors, path, PATTERN_FAILED)
        return
    max_length = schema.get("maxLength")
    if max_length is not None and len(value) > int(max_length):
        _add_error(errors, path, f"value may only be {_perl_num(max_length)} characters long")
        return
    min_length = schema.get("minLength")
    if min_length is not None and len(value) < int(min_length):
        _add_error(errors, path, f"value must be at least {_perl_num(min_length)} characters long")
        return
    if _is_number(value):
        number = float(value)
        maximum = schema.get("maximum")
        if maximum is not None and number > float(maximum):
            _add_error(errors, path, f"value must have a maximum value of {_perl_num(maximum)}")
            return
        minimum = schema.get("minimum")
        if minimum is not None and number < float(minimum):
            _add_error(errors, path, f"value must have a minimum value of {_perl_num(minimum)}")
            return
    enum = schema.get("enum")
    if enum is not None and value not in [str(e) for e in enum]:
        choices = ", ".join(str(e) for e in enum)
        _add_error(
            errors, path, f"value '{value}' does not have a value in the enumeration '{choices}'"
        )


def _normalise(value: object, schema: Mapping[str, Any] | None) -> _Value | None:
    """Turn a form string or a JSON value into what ``check_prop`` sees."""
    if value is None:
        return None
    if isinstance(value, bool):
        return _JsonBool(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return str(int(value))
        return format(value, ".15g")
    if isinstance(value, list | tuple):
        fmt = schema.get("format") if schema else None
        if isinstance(fmt, str) and fmt.endswith("-list"):
            # RESTHandler joins a JSON array given for a ``*-list`` string (pve-reference §1.1).
            return ",".join(str(v) for v in value)
        return _TypeMismatch("ARRAY")
    if isinstance(value, dict):
        return _TypeMismatch("HASH")
    return str(value)


class _TypeMismatch(str):
    """A JSON array or object where a scalar was expected; Perl reports its ref type."""

    __slots__ = ()


# --- routes ------------------------------------------------------------------------------------


@dataclass
class _RouteNode:
    literals: dict[str, _RouteNode]
    placeholder: tuple[str, _RouteNode] | None
    methods: dict[str, str]  # method → schema key

    @classmethod
    def empty(cls) -> _RouteNode:
        return cls({}, None, {})


@dataclass(frozen=True)
class _Endpoint:
    key: str
    properties: Mapping[str, Mapping[str, Any]]
    indexed: Mapping[str, tuple[int, Mapping[str, Any]]]  # prefix → (max index, schema)
    additional: bool


_INDEXED_NAME = re.compile(r"([a-z][a-z_-]*?)(\d+)\Z")


def _split_path(path: str) -> list[str]:
    path = path.split("?", 1)[0]
    if path.startswith("/api2/json/") or path == "/api2/json":
        path = path[len("/api2/json") :]
    return [seg for seg in path.split("/") if seg != ""]


class Schema:
    """The Proxmox API schema: route lookup and parameter verification."""

    def __init__(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        self._entries: dict[str, Mapping[str, Any]] = {
            k: v for k, v in entries.items() if not k.startswith("_")
        }
        self._root = _RouteNode.empty()
        self._endpoints: dict[str, _Endpoint] = {}
        for key, entry in self._entries.items():
            method, template = key.split(" ", 1)
            node = self._root
            for segment in _split_path(template):
                if segment.startswith("{") and segment.endswith("}"):
                    name = segment[1:-1]
                    if node.placeholder is None:
                        node.placeholder = (name, _RouteNode.empty())
                    node = node.placeholder[1]
                else:
                    node = node.literals.setdefault(segment, _RouteNode.empty())
            node.methods[method] = key
            self._endpoints[key] = self._compile(key, entry)

    @staticmethod
    def _compile(key: str, entry: Mapping[str, Any]) -> _Endpoint:
        params = entry.get("parameters") or {}
        props: dict[str, Mapping[str, Any]] = {}
        indexed: dict[str, tuple[int, Mapping[str, Any]]] = {}
        for name, schema in (params.get("properties") or {}).items():
            if name.endswith("[n]"):
                prefix = name[:-3]
                described = _INDEX_FROM_DESCRIPTION.search(schema.get("description", ""))
                top = int(described.group(1)) if described else _INDEX_MAX.get(prefix, 255)
                indexed[prefix] = (top, schema)
            else:
                props[name] = schema
            pattern = schema.get("pattern")
            if pattern is not None:
                _compiled(pattern)  # fail at load time, not on a request, if one will not compile
        additional = bool(params.get("additionalProperties", 1))
        return _Endpoint(key, props, indexed, additional)

    # --- loading ---------------------------------------------------------------------------

    @classmethod
    def from_files(cls, paths: Iterable[Path | str]) -> Schema:
        entries: dict[str, Mapping[str, Any]] = {}
        for path in paths:
            with open(path, encoding="utf-8") as fh:
                entries.update(json.load(fh))
        return cls(entries)

    @classmethod
    def default(cls) -> Schema:
        """The vendored schema (``data/endpoints.json`` + ``data/extra-endpoints.json``)."""
        return _default_schema()

    # --- lookup ----------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._entries)

    def entry(self, key: str) -> Mapping[str, Any]:
        """The raw schema object of ``key`` (``proxyto``, ``returns``, ``permissions``...)."""
        return self._entries[key]

    def _lookup(self, path: str, method: str | None) -> RouteMatch | None:
        """Walk the route tree; literal segments are tried before a placeholder."""
        segments = _split_path(path)

        def walk(node: _RouteNode, i: int, found: dict[str, str]) -> RouteMatch | None:
            if i == len(segments):
                if method is None:
                    key = next(iter(node.methods.values()), None)
                else:
                    key = node.methods.get(method)
                return RouteMatch(key, found) if key else None
            raw = segments[i]
            literal = node.literals.get(unquote(raw))
            if literal is not None:
                hit = walk(literal, i + 1, found)
                if hit is not None:
                    return hit
            if node.placeholder is not None:
                name, child = node.placeholder
                return walk(child, i + 1, {**found, name: unquote(raw)})
            return None

        return walk(self._root, 0, {})

    def match(self, method: str, path: str) -> RouteMatch | None:
        """The schema entry for ``method`` on ``path`` (relative to ``/api2/json``).

        ``path`` is still percent-encoded, as received. Literal segments win over placeholders
        (``.../status/current`` is never ``{...}``); placeholder values come back decoded, so
        a UPID or a volid with ``:`` and ``@`` arrives intact.
        """
        return self._lookup(path, method.upper())

    def has_path(self, path: str) -> bool:
        """Whether any method exists for ``path`` (the engine's 501 text needs to know)."""
        return self._lookup(path, None) is not None

    # --- verification ----------------------------------------------------------------------

    def _property(self, endpoint: _Endpoint, name: str) -> Mapping[str, Any] | None:
        schema = endpoint.properties.get(name)
        if schema is not None:
            return schema
        m = _INDEXED_NAME.match(name)
        if m and m.group(1) in endpoint.indexed:
            top, indexed_schema = endpoint.indexed[m.group(1)]
            index = m.group(2)
            if (index == "0" or not index.startswith("0")) and int(index) <= top:
                return indexed_schema
        return None

    def validate(self, key: str, params: Mapping[str, object]) -> dict[str, str]:
        """Proxmox's parameter verification of ``params`` against endpoint ``key``.

        ``params`` are the path parameters merged with the query/form (or JSON) parameters.
        Returns ``{parameter: Proxmox's error text}``; empty when the request is valid. The
        caller answers a non-empty result with 400 ``Parameter verification failed.``.
        """
        endpoint = self._endpoints[key]
        errors: dict[str, str] = {}
        values: dict[str, _Value] = {}
        for name, raw in params.items():
            schema = self._property(endpoint, name)
            value = _normalise(raw, schema)
            if value is not None:
                values[name] = value
        for name, schema in endpoint.properties.items():
            self._check(values.get(name), schema, name, errors)
        for name, value in values.items():
            schema = self._property(endpoint, name)
            if schema is None:
                if not endpoint.additional:
                    _add_error(errors, name, NOT_DEFINED)
                continue
            if name not in endpoint.properties:
                self._check(value, schema, name, errors)
            requires = schema.get("requires")
            if isinstance(requires, str) and requires not in values:
                _add_error(errors, requires, f"missing property required by '{name}'")
        return errors

    @staticmethod
    def _check(
        value: _Value | None, schema: Mapping[str, Any], path: str, errors: dict[str, str]
    ) -> None:
        if isinstance(value, _TypeMismatch):
            _add_error(errors, path, f"type check ('{schema.get('type')}') failed - got {value}")
            return
        _check_prop(value, schema, path, errors)


@functools.cache
def _default_schema() -> Schema:
    return Schema.from_files(DEFAULT_FILES)
