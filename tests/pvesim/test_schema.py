"""The simulator's parameter verification answers exactly as Proxmox's JSONSchema.pm does.

Texts and the order of checks come from pve-reference §1.1, §1.3 and §5 and from the schema
failures recorded in ``examples/errors.json``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pvesim.schema import DATA_DIR, RouteMatch, Schema

REFERENCE = Path("/work/shared/pve-reference")
needs_reference = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason="the shared pve-reference is only present on development hosts"
)

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
PUT_CONFIG = "PUT /nodes/{node}/qemu/{vmid}/config"
NOT_DEFINED = (
    "property is not defined in schema and the schema does not allow additional properties"
)


@pytest.fixture(scope="module")
def schema() -> Schema:
    return Schema.default()


def put_config(schema: Schema, **params: object) -> dict[str, str]:
    return schema.validate(PUT_CONFIG, {"node": "pve1", "vmid": "123", **params})


def clone(schema: Schema, **params: object) -> dict[str, str]:
    return schema.validate(CLONE, {"node": "pve1", "vmid": "9000", **params})


# --- the vendored copy is the official one ---------------------------------------------------


@needs_reference
def test_vendored_endpoints_are_the_official_file() -> None:
    official = json.loads((REFERENCE / "schema/endpoints.json").read_text())
    vendored = json.loads((DATA_DIR / "endpoints.json").read_text())
    assert vendored == official


@needs_reference
def test_vendored_extra_endpoints_are_copied_unchanged_from_all_endpoints() -> None:
    every = json.loads((REFERENCE / "schema/all-endpoints.json").read_text())
    extra = json.loads((DATA_DIR / "extra-endpoints.json").read_text())
    assert "GET /nodes/{node}/network" in extra
    assert extra["_source"].startswith(every["_source"].split(" All endpoints:")[0])
    for key, entry in extra.items():
        if key != "_source":
            assert entry == every[key], key


def test_default_schema_serves_the_endpoints_the_simulator_answers(schema: Schema) -> None:
    for key in ("GET /version", "GET /nodes/{node}/network", "GET /cluster/status", CLONE):
        assert schema.entry(key)["method"] == key.split()[0]


# --- errors.json: every schema failure recorded there, reproduced --------------------------

# The six records of examples/errors.json whose source is pve-common JSONSchema.pm, as
# (request line, expected ``errors``). The table is checked against the file itself below,
# so it cannot drift, and runs where /work/shared does not exist.
SCHEMA_FAILURES = [
    (
        "POST /api2/json/nodes/pve1/qemu/9000/clone newid=50",
        {"newid": "invalid format - value does not look like a valid VM ID\n"},
    ),
    (
        "POST /api2/json/nodes/pve1/qemu/9000/clone newid=abc",
        {"newid": "type check ('integer') failed - got 'abc'"},
    ),
    (
        "POST /api2/json/nodes/pve1/qemu/9000/clone (newid missing)",
        {"newid": "property is missing and it is not optional"},
    ),
    (
        "PUT /api2/json/nodes/pve1/qemu/123/config foo=1",
        {"foo": NOT_DEFINED},
    ),
    (
        "POST /api2/json/nodes/pve1/qemu/9000/clone newid=123 name=proxy_fra_123",
        {"name": "invalid format - value does not look like a valid DNS name\n"},
    ),
    (
        "PUT /api2/json/nodes/pve1/qemu/123/config tags=proxy;fra!",
        {"tags": "invalid format - invalid characters in tag\n"},
    ),
]

# 400s of errors.json raised by handler code *after* the schema passed: the schema must let
# them through, or the simulator would answer with the wrong text.
HANDLER_400S = [
    "PUT /api2/json/nodes/pve1/qemu/123/config delete=foo",
    "PUT /api2/json/nodes/pve1/qemu/123/config cores=4 delete=cores",
    "POST /api2/json/nodes/pve1/qemu/123/status/stop skiplock=1 (API token of root@pam)",
    "GET /api2/json/cluster/nextid?vmid=123 (123 in use)",
    "GET /api2/json/nodes/pve1/tasks/garbage/status",
    "GET /api2/json/nodes/pve2/tasks/UPID:pve1:.../status (task belongs to another node)",
    "GET /api2/json/nodes/pve1/storage/nosuch/status",
]


def parse_request(line: str) -> tuple[str, str, dict[str, str]]:
    """``"POST /api2/json/x k=v (comment)"`` → method, path below /api2/json, parameters."""
    line = re.sub(r"\s*\(.*\)\s*$", "", line)
    method, target, *pairs = line.split()
    path, _, query = target.partition("?")
    params = dict(pair.split("=", 1) for pair in [*pairs, *filter(None, query.split("&"))])
    return method, path.removeprefix("/api2/json"), params


@pytest.mark.parametrize(("request_line", "expected"), SCHEMA_FAILURES)
def test_schema_failure_of_errors_json(schema: Schema, request_line: str, expected: dict) -> None:
    method, path, params = parse_request(request_line)
    route = schema.match(method, path)
    assert route is not None
    assert schema.validate(route.key, {**route.path_params, **params}) == expected


@pytest.mark.parametrize("request_line", HANDLER_400S)
def test_handler_level_400s_pass_the_schema(schema: Schema, request_line: str) -> None:
    method, path, params = parse_request(request_line)
    route = schema.match(method, path)
    assert route is not None
    assert schema.validate(route.key, {**route.path_params, **params}) == {}


@needs_reference
def test_schema_failure_table_matches_errors_json() -> None:
    records = json.loads((REFERENCE / "examples/errors.json").read_text())
    from_file = [
        (r["request"], r["body"]["errors"]) for r in records if "JSONSchema.pm" in r["source"]
    ]
    assert from_file == SCHEMA_FAILURES
    handler_400s = [
        r["request"]
        for r in records
        if r["http_status"] == 400 and "JSONSchema.pm" not in r["source"]
    ]
    assert handler_400s == HANDLER_400S


# --- routes ------------------------------------------------------------------------------------


def test_literal_segments_win_over_placeholders(schema: Schema) -> None:
    assert schema.match("GET", "/nodes/pve1/qemu/123/status/current") == RouteMatch(
        "GET /nodes/{node}/qemu/{vmid}/status/current", {"node": "pve1", "vmid": "123"}
    )
    assert schema.match("GET", "/cluster/nextid") == RouteMatch("GET /cluster/nextid", {})


def test_placeholders_are_percent_decoded(schema: Schema) -> None:
    upid = "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc@pve!django:"
    encoded = upid.replace(":", "%3A").replace("@", "%40").replace("!", "%21")
    route = schema.match("GET", f"/nodes/pve1/tasks/{encoded}/log")
    assert route == RouteMatch("GET /nodes/{node}/tasks/{upid}/log", {"node": "pve1", "upid": upid})
    volume = schema.match("DELETE", "/nodes/pve1/storage/local/content/local%3Aiso%2Fa.iso")
    assert volume is not None and volume.path_params["volume"] == "local:iso/a.iso"


def test_unknown_routes_and_methods(schema: Schema) -> None:
    assert schema.match("GET", "/nodes/pve1/qemu/123/foo") is None
    assert not schema.has_path("/nodes/pve1/qemu/123/foo")
    # The path exists, only not for this method: Proxmox still answers 501.
    assert schema.match("PATCH", "/nodes/pve1/qemu/123/config") is None
    assert schema.has_path("/nodes/pve1/qemu/123/config")


# --- type checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["true", "yes", "on", "2"])
def test_form_booleans_are_only_1_and_0(schema: Schema, word: str) -> None:
    assert clone(schema, newid="123", full=word) == {
        "full": f"type check ('boolean') failed - got '{word}'"
    }
    assert clone(schema, newid="123", full="1") == {}
    assert clone(schema, newid="123", full="0") == {}


def test_json_bodies_may_carry_booleans_and_numbers(schema: Schema) -> None:
    assert clone(schema, newid=123, full=True, name="proxy-a") == {}
    assert clone(schema, newid=12.5) == {"newid": "type check ('integer') failed - got '12.5'"}
    assert clone(schema, newid=True) == {
        "newid": "type check ('integer') failed - got JSON::PP::Boolean"
    }


def test_json_array_is_accepted_for_list_formats_only(schema: Schema) -> None:
    assert put_config(schema, delete=["ide2", "net1"]) == {}
    assert put_config(schema, tags=["a", "b!"]) == {
        "tags": "invalid format - invalid characters in tag\n"
    }
    assert put_config(schema, name=["a"]) == {"name": "type check ('string') failed - got ARRAY"}


def test_signed_integers_pass_the_type_check(schema: Schema) -> None:
    assert put_config(schema, cores="+2") == {}
    assert put_config(schema, cores="2.0") == {"cores": "type check ('integer') failed - got '2.0'"}


# --- order of the checks: type → format → pattern → maxLength → minLength → range → enum ----


def test_type_is_checked_before_format(schema: Schema) -> None:
    assert clone(schema, newid="9x") == {"newid": "type check ('integer') failed - got '9x'"}


def test_format_is_checked_before_minimum(schema: Schema) -> None:
    # newid=50 is below the schema minimum of 100, but pve-vmid's regex speaks first.
    assert clone(schema, newid="50") == {
        "newid": "invalid format - value does not look like a valid VM ID\n"
    }


def test_format_is_checked_before_maxlength(schema: Schema) -> None:
    # snapname: format pve-configid, maxLength 40.
    assert clone(schema, newid="123", snapname="1" * 50) == {
        "snapname": "invalid format - invalid configuration ID '" + "1" * 50 + "'\n"
    }
    assert clone(schema, newid="123", snapname="s" * 41) == {
        "snapname": "value may only be 40 characters long"
    }


def test_range_and_enum_texts(schema: Schema) -> None:
    assert put_config(schema, cores="0") == {"cores": "value must have a minimum value of 1"}
    assert schema.validate(
        "GET /nodes/{node}/tasks/{upid}/log", {"node": "pve1", "upid": "x", "limit": "-1"}
    ) == {"limit": "value must have a minimum value of 0"}
    assert schema.validate(
        "DELETE /nodes/{node}/storage/{storage}/content/{volume}",
        {"node": "pve1", "storage": "local", "volume": "local:iso/a.iso", "delay": "31"},
    ) == {"delay": "value must have a maximum value of 30"}
    assert schema.validate("GET /cluster/resources", {"type": "vms"}) == {
        "type": "value 'vms' does not have a value in the enumeration 'vm, storage, node, sdn'"
    }


def test_pattern_text(schema: Schema) -> None:
    resize = "PUT /nodes/{node}/qemu/{vmid}/resize"
    base = {"node": "pve1", "vmid": "123", "disk": "scsi0"}
    assert schema.validate(resize, {**base, "size": "10G"}) == {}
    assert schema.validate(resize, {**base, "size": "+512M"}) == {}
    assert schema.validate(resize, {**base, "size": "10GB"}) == {
        "size": "value does not match the regex pattern"
    }


def test_description_is_limited_to_8192_characters(schema: Schema) -> None:
    assert put_config(schema, description="d" * 8192) == {}
    assert put_config(schema, description="d" * 8193) == {
        "description": "value may only be 8192 characters long"
    }


# --- required, unknown, requires -------------------------------------------------------------


def test_path_parameters_are_validated_too(schema: Schema) -> None:
    errors = schema.validate(PUT_CONFIG, {"node": "pve_1", "vmid": "abc"})
    assert errors == {
        "node": "invalid format - value does not look like a valid node name\n",
        "vmid": "type check ('integer') failed - got 'abc'",
    }


def test_requires_is_reported_on_the_missing_parameter(schema: Schema) -> None:
    upload = "POST /nodes/{node}/storage/{storage}/upload"
    base = {"node": "pve1", "storage": "local", "content": "iso", "filename": "a.iso"}
    assert schema.validate(upload, {**base, "checksum": "abc"}) == {
        "checksum-algorithm": "missing property required by 'checksum'"
    }
    assert (
        schema.validate(upload, {**base, "checksum": "abc", "checksum-algorithm": "sha256"}) == {}
    )
    assert put_config(schema, force="1") == {"delete": "missing property required by 'force'"}


# --- named formats ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"storage": "x"}, "storage ID 'x' cannot be shorter than 2 characters"),
        ({"storage": "local lvm"}, "storage ID 'local lvm' contains illegal characters"),
        ({"target": "-pve"}, "value does not look like a valid node name"),
        ({"name": "proxy-a."}, "value does not look like a valid DNS name"),
        ({"snapname": "1abc"}, "invalid configuration ID '1abc'"),
        ({"pool": "a b"}, "pool name 'a b' contains invalid characters"),
    ],
)
def test_named_format_texts_on_clone(schema: Schema, params: dict, expected: str) -> None:
    [(key, text)] = clone(schema, newid="123", **params).items()
    assert (key, text) == (next(iter(params)), f"invalid format - {expected}\n")


def test_valid_clone_parameters_pass(schema: Schema) -> None:
    assert (
        clone(
            schema,
            newid="100123",
            name="proxy-fra-1",
            description="proxyhub-managed=true\nproxyhub-uid=1",
            full="1",
            storage="local-lvm",
            target="pve2",
            pool="fleet/eu",
        )
        == {}
    )


def test_tag_lists_accept_every_separator(schema: Schema) -> None:
    assert put_config(schema, tags="proxyhub;managed,Proxy other") == {}


def test_delete_list_entries_are_configids(schema: Schema) -> None:
    assert put_config(schema, delete="ide2,net1;unused0") == {}
    assert put_config(schema, delete="ide2,2x") == {
        "delete": "invalid format - invalid configuration ID '2x'\n"
    }


def test_hookscript_is_a_volume_id(schema: Schema) -> None:
    assert put_config(schema, hookscript="local:snippets/hook.pl") == {}
    assert put_config(schema, hookscript="hook.pl") == {
        "hookscript": "invalid format - unable to parse volume ID 'hook.pl'\n"
    }


# --- property strings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"net0": "virtio=BC:24:11:D2:47:9A,bridge=vmbr0,firewall=1,tag=20"},
        {"net0": "virtio,bridge=vmbr0"},
        {"net0": "model=e1000,macaddr=BC:24:11:00:00:01,bridge=vmbr1"},
        {"net0": "virtio,bridge=vmbr0,firewall=yes"},  # property strings take yes/on/true
        {"net31": "virtio,bridge=vmbr0"},
        {"agent": "1"},
        {"agent": "enabled=1,fstrim_cloned_disks=1,type=virtio"},
        {"agent": "1,freeze-fs-on-backup=0"},  # an alias of freeze-fs
        {"memory": "2048"},
        {"memory": "current=4096"},
        {"scsi0": "local-lvm:vm-123-disk-0,discard=on,iothread=1,size=20G,ssd=1"},
        {"scsi0": "local-lvm:32"},
        {"ide2": "local:iso/proxy-a-seed.iso,media=cdrom"},
        {"ide2": "none,media=cdrom"},
        {"unused0": "local-lvm:vm-123-disk-1"},
        {"boot": "order=scsi0;ide2;net0"},
        {"boot": "cdn"},
        {"smbios1": "uuid=0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0,manufacturer=cHJveHk=,base64=1"},
        {"ipconfig0": "ip=10.0.0.5/24,gw=10.0.0.1"},
        {"cpu": "host,flags=+aes"},
    ],
)
def test_valid_property_strings(schema: Schema, params: dict) -> None:
    assert put_config(schema, **params) == {}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"net0": "virtio,bridge=vmbr0,speed=10"},
            "invalid format - invalid key in comma-separated list property: speed\n",
        ),
        (
            {"net0": "bridge=vmbr0"},
            "invalid format - format error\n"
            "net0.model: property is missing and it is not optional\n",
        ),
        (
            {"net0": "virtio,bridge=vmbr0,tag=5000"},
            "invalid format - format error\nnet0.tag: value must have a maximum value of 4094\n",
        ),
        (
            {"net0": "virtio=01:00:00:00:00:01,bridge=vmbr0"},
            "invalid format - format error\nnet0.macaddr: invalid format - "
            "value does not look like a valid unicast MAC address\n\n",
        ),
        (
            {"net0": "virtio,virtio"},
            "invalid format - duplicate key in comma-separated list property: model\n",
        ),
        (
            {"agent": "true"},
            "invalid format - format error\n"
            "agent.enabled: type check ('boolean') failed - got 'true'\n",
        ),
        (
            {"agent": "1,type=usb"},
            "invalid format - format error\nagent.type: value 'usb' does not have a value in "
            "the enumeration 'virtio, isa'\n",
        ),
        (
            {"memory": "8"},
            "invalid format - format error\n"
            "memory.current: value must have a minimum value of 16\n",
        ),
        (
            {"memory": "2G"},
            "invalid format - format error\n"
            "memory.current: type check ('integer') failed - got '2G'\n",
        ),
        (
            {"scsi0": "local-lvm:vm-123-disk-0,size=10X"},
            "invalid format - format error\nscsi0.size: invalid format - "
            "value '10X' does not look like a valid disk size\n\n",
        ),
        (
            {"boot": "order=scsi0,net0"},
            "invalid format - format error\nboot.legacy: value does not match the regex pattern\n",
        ),
        (
            {"smbios1": "uuid=x,colour=red"},
            "invalid format - invalid key in comma-separated list property: colour\n",
        ),
        (
            {"ipconfig0": "ip=dhcp,dns=1.1.1.1"},
            "invalid format - invalid key in comma-separated list property: dns\n",
        ),
        ({"memory": "current="}, "invalid format - missing key in comma-separated list property\n"),
    ],
)
def test_invalid_property_strings(schema: Schema, params: dict, expected: str) -> None:
    assert put_config(schema, **params) == {next(iter(params)): expected}


@pytest.mark.parametrize("key", ["net32", "scsi31", "ide4", "virtio16", "net01", "netx"])
def test_indexed_keys_outside_their_range_are_unknown(schema: Schema, key: str) -> None:
    assert put_config(schema, **{key: "virtio,bridge=vmbr0"}) == {key: NOT_DEFINED}


@pytest.mark.parametrize("key", ["net0", "scsi30", "ide3", "virtio15", "sata5", "unused255"])
def test_indexed_keys_inside_their_range_match_the_schema(schema: Schema, key: str) -> None:
    value = "virtio,bridge=vmbr0" if key.startswith("net") else "local-lvm:vm-123-disk-3"
    assert put_config(schema, **{key: value}) == {}


def test_every_schema_pattern_compiles() -> None:
    # Patterns are Perl regexes; Schema compiles all of them on load and must not choke.
    schema = Schema.from_files([DATA_DIR / "endpoints.json", DATA_DIR / "extra-endpoints.json"])
    assert len(schema.keys()) > 60
