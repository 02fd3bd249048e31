"""Seed 000 entry 15 (the cluster block) and entry 3 (placement) as an operator meets them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioning.proxmox.config import (
    ConfigError,
    FieldError,
    MachineType,
    ProxmoxConfig,
    TemplateRef,
)
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.placement import resolve_machine_type, resolve_template, resolve_zone

INSTALLATION = "6c1b2f0e-inst"

# DESIGN §7's import example, without the document's apiVersion/kind envelope.
EXAMPLE: dict[str, Any] = {
    "name": "proxmox-home",
    "url": "https://192.168.0.8:8006",
    "tokenFile": "/etc/proxyhub/proxmox/token",
    "caFile": "/etc/proxyhub/proxmox/ca.pem",
    "nodes": ["pv1-1"],
    "isoStorage": "proxy-seeds",
    "vlanTag": 4,
    "vmidRange": {"min": 100000, "max": 199999},
    "templates": {"debian-13": {"vmid": 9001}},
    "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10}},
}


def _doc(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


_DROP = object()


def _errors(doc: dict[str, Any], prefix: str = "") -> list[str]:
    with pytest.raises(ConfigError) as caught:
        ProxmoxConfig.from_mapping(doc, installation_id=INSTALLATION, prefix=prefix)
    return [str(e) for e in caught.value.errors]


def test_the_design_example_loads_with_the_seed_defaults() -> None:
    config = ProxmoxConfig.from_mapping(EXAMPLE, installation_id=INSTALLATION)
    assert config == ProxmoxConfig(
        name="proxmox-home",
        url="https://192.168.0.8:8006",
        token_file="/etc/proxyhub/proxmox/token",
        ca_file="/etc/proxyhub/proxmox/ca.pem",
        nodes=("pv1-1",),
        iso_storage="proxy-seeds",
        vlan_tag=4,
        templates={"debian-13": TemplateRef(vmid=9001)},
        machine_types={"small": MachineType(cores=1, memory_mib=1024, disk_gib=10)},
        installation_id=INSTALLATION,
    )
    # Entry 15's defaults.
    assert config.insecure_skip_tls_verify is False
    assert (config.vmid_min, config.vmid_max) == (100000, 199999)
    assert config.request_timeout_seconds == 30.0
    assert config.install_guest_agent is True
    assert config.storage is None and config.bridge is None and config.vendor_data is None


def test_to_mapping_round_trips() -> None:
    full = _doc(
        insecureSkipTLSVerify=True,
        nodes=["pv1-1", "pv1-2"],
        storage="local-lvm",
        bridge="vmbr1",
        vmidRange={"min": 500, "max": 900},
        templates={"debian-13": {"vmid": 9001}, "alpine": {"vmid": 9002}},
        machineTypes={
            "small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10},
            "tiny": {"cores": 1, "memoryMiB": 512},
        },
        requestTimeoutSeconds=12.5,
        vendorData="#cloud-config\nntp: {enabled: true}\n",
        installGuestAgent=False,
        driftPolicy="repair",
    )
    config = ProxmoxConfig.from_mapping(full, installation_id=INSTALLATION)
    exported = config.to_mapping()
    assert exported == full
    assert ProxmoxConfig.from_mapping(exported, installation_id=INSTALLATION) == config
    # The minimal document exports its defaults explicitly and still round-trips.
    minimal = ProxmoxConfig.from_mapping(EXAMPLE, installation_id=INSTALLATION)
    assert minimal.to_mapping()["requestTimeoutSeconds"] == 30
    assert ProxmoxConfig.from_mapping(minimal.to_mapping(), installation_id=INSTALLATION) == minimal


def test_null_means_absent() -> None:
    config = ProxmoxConfig.from_mapping(
        _doc(caFile=None, vlanTag=None, vendorData=None), installation_id=INSTALLATION
    )
    assert config.ca_file is None and config.vlan_tag is None and config.vendor_data is None


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # Required keys.
        ({"url": _DROP}, "url: is required"),
        ({"tokenFile": _DROP}, "tokenFile: is required"),
        ({"nodes": _DROP}, "nodes: is required"),
        ({"isoStorage": _DROP}, "isoStorage: is required"),
        ({"templates": _DROP}, "templates: is required"),
        ({"machineTypes": _DROP}, "machineTypes: is required"),
        ({"name": _DROP}, "name: is required"),
        # url: https with a host and no path other than /.
        ({"url": "http://pve:8006"}, "url: must be an https URL with a host"),
        ({"url": "https://pve:8006/api2/json"}, "url: must be an https URL with a host"),
        ({"url": "https://:8006"}, "url: must be an https URL with a host"),
        ({"url": "https://pve:port"}, "url: must be an https URL with a host"),
        ({"url": "https://pve:8006/?x=1"}, "url: must be an https URL with a host"),
        ({"url": 8006}, "url: must be an https URL with a host and no path other than /, such as"),
        # nodes: at least one, unique, node-name shaped.
        ({"nodes": []}, "nodes: must list at least one node"),
        ({"nodes": "pv1-1"}, 'nodes: must be a list of node names, got "pv1-1"'),
        ({"nodes": ["pv1-1", "pv1-1"]}, 'nodes[1]: duplicates nodes[0] ("pv1-1")'),
        ({"nodes": ["pv1-1", "PV_2"]}, "nodes[1]: must be a node name"),
        ({"nodes": ["pv1-1", 5]}, "nodes[1]: must be a node name (lower-case letters, digits"),
        # Storage ids (pve-reference §5.1).
        ({"isoStorage": "9seeds"}, "isoStorage: must be a Proxmox storage id"),
        ({"isoStorage": "s"}, "isoStorage: must be a Proxmox storage id"),
        ({"storage": "local lvm"}, "storage: must be a Proxmox storage id"),
        ({"caFile": ""}, 'caFile: must be a non-empty file path when set, got ""'),
        ({"tokenFile": " "}, 'tokenFile: must be a non-empty file path, got " "'),
        ({"bridge": "vmbr0,tag=3"}, "bridge: must be a bridge name"),
        # vlanTag 1..4094, and a bool is not an integer.
        ({"vlanTag": 0}, "vlanTag: must be an integer from 1 to 4094 when set, got 0"),
        ({"vlanTag": 4095}, "vlanTag: must be an integer from 1 to 4094 when set, got 4095"),
        ({"vlanTag": True}, "vlanTag: must be an integer from 1 to 4094 when set, got true"),
        ({"vlanTag": "4"}, 'vlanTag: must be an integer from 1 to 4094 when set, got "4"'),
        # vmidRange.
        (
            {"vmidRange": {"min": 99, "max": 200}},
            "vmidRange.min: must be an integer from 100 to 999999999, got 99",
        ),
        (
            {"vmidRange": {"min": 100, "max": 1_000_000_000}},
            "vmidRange.max: must be an integer from 100 to 999999999, got 1000000000",
        ),
        (
            {"vmidRange": {"min": 5000, "max": 5000}},
            "vmidRange: min must be below max, got min 5000 and max 5000",
        ),
        ({"vmidRange": [1, 2]}, "vmidRange: must be a map with min and max, got a list"),
        # templates.
        ({"templates": {}}, "templates: must hold at least one template"),
        (
            {"templates": {"debian-13": {"vmid": 99}}},
            "templates.debian-13.vmid: must be an integer from 100 to 999999999, got 99",
        ),
        ({"templates": {"debian-13": {}}}, "templates.debian-13.vmid: is required"),
        ({"templates": {"debian-13": 9001}}, "templates.debian-13: must be a map with vmid"),
        ({"templates": {"Debian 13": {"vmid": 9001}}}, "templates.Debian 13: the key must be"),
        (
            {"templates": {"a" * 64: {"vmid": 9001}}},
            f"templates.{'a' * 64}: the key must be lower-case letters, digits and inner hyphens, "
            "at most 63 characters",
        ),
        # machineTypes.
        ({"machineTypes": {}}, "machineTypes: must hold at least one machine type"),
        (
            {"machineTypes": {"small": {"cores": 0, "memoryMiB": 1024}}},
            "machineTypes.small.cores: must be an integer of at least 1, got 0",
        ),
        (
            {"machineTypes": {"small": {"cores": True, "memoryMiB": 1024}}},
            "machineTypes.small.cores: must be an integer of at least 1, got true",
        ),
        (
            {"machineTypes": {"small": {"cores": 1.5, "memoryMiB": 1024}}},
            "machineTypes.small.cores: must be an integer of at least 1, got 1.5",
        ),
        (
            {"machineTypes": {"small": {"cores": 1, "memoryMiB": 8}}},
            "machineTypes.small.memoryMiB: must be an integer of at least 16, got 8",
        ),
        (
            {"machineTypes": {"small": {"cores": 1, "memoryMiB": 512, "diskGiB": -1}}},
            "machineTypes.small.diskGiB: must be an integer of at least 0 when set, got -1",
        ),
        ({"machineTypes": {"small": {"cores": 1}}}, "machineTypes.small.memoryMiB: is required"),
        # The rest.
        (
            {"requestTimeoutSeconds": -1},
            "requestTimeoutSeconds: must be a number of seconds of at least 0, got -1",
        ),
        (
            {"requestTimeoutSeconds": True},
            "requestTimeoutSeconds: must be a number of seconds of at least 0, got true",
        ),
        (
            {"insecureSkipTLSVerify": "yes"},
            'insecureSkipTLSVerify: must be true or false, got "yes"',
        ),
        ({"installGuestAgent": 1}, "installGuestAgent: must be true or false, got 1"),
        ({"driftPolicy": "fix"}, 'driftPolicy: must be report or repair, got "fix"'),
        ({"name": "Proxmox Home"}, "name: must be a cluster name"),
        # Unknown keys, at every level.
        ({"vlanTags": 4}, "vlanTags: is not a known key; allowed: name, url, tokenFile"),
        (
            {"vmidRange": {"min": 100000, "max": 199999, "step": 1}},
            "vmidRange.step: is not a known key; allowed: min, max",
        ),
        (
            {"templates": {"debian-13": {"vmid": 9001, "node": "pv1-1"}}},
            "templates.debian-13.node: is not a known key; allowed: vmid",
        ),
        (
            {"machineTypes": {"small": {"cores": 1, "memoryMiB": 512, "memory": 512}}},
            "machineTypes.small.memory: is not a known key; allowed: cores, memoryMiB, diskGiB",
        ),
    ],
)
def test_from_mapping_refuses_with_the_path_and_what_is_allowed(
    changes: dict[str, Any], expected: str
) -> None:
    errors = _errors(_doc(**changes))
    assert any(e.startswith(expected) for e in errors), errors
    # One problem is reported once, not again as a follow-on complaint.
    assert len(errors) == 1, errors


def test_every_problem_is_collected_in_document_order_with_the_prefix() -> None:
    doc = _doc(
        url="http://pve",
        nodes=["pv1-1", "Bad"],
        vlanTag=5000,
        machineTypes={"small": {"cores": 0, "memoryMiB": 1024}, "big": {"cores": "x"}},
        extra=1,
    )
    errors = _errors(doc, prefix="clusters[2].")
    assert errors == [
        "clusters[2].url: must be an https URL with a host and no path other than /, such as "
        'https://pve1:8006, got "http://pve"',
        "clusters[2].nodes[1]: must be a node name (lower-case letters, digits and inner "
        'hyphens), got "Bad"',
        "clusters[2].vlanTag: must be an integer from 1 to 4094 when set, got 5000",
        "clusters[2].machineTypes.big.memoryMiB: is required",
        "clusters[2].machineTypes.small.cores: must be an integer of at least 1, got 0",
        "clusters[2].extra: is not a known key; allowed: name, url, tokenFile, caFile, "
        "insecureSkipTLSVerify, nodes, isoStorage, storage, bridge, vlanTag, pool, vmidRange, "
        "templates, machineTypes, requestTimeoutSeconds, vendorData, installGuestAgent, "
        "driftPolicy",
    ]
    with pytest.raises(ConfigError) as caught:
        ProxmoxConfig.from_mapping(doc, installation_id=INSTALLATION, prefix="clusters[2].")
    assert str(caught.value) == "; ".join(errors)


@pytest.mark.parametrize("section", ["templates", "machineTypes"])
def test_at_most_128_catalogue_entries(section: str) -> None:
    entry = {"vmid": 9001} if section == "templates" else {"cores": 1, "memoryMiB": 512}
    assert not _errors_or_none(_doc(**{section: {f"k{i}": entry for i in range(128)}}))
    errors = _errors(_doc(**{section: {f"k{i}": entry for i in range(129)}}))
    assert errors == [f"{section}: must hold at most 128 entries, got 129"]


def _errors_or_none(doc: dict[str, Any]) -> list[str]:
    try:
        ProxmoxConfig.from_mapping(doc, installation_id=INSTALLATION)
    except ConfigError as err:
        return [str(e) for e in err.errors]
    return []


def test_a_url_with_credentials_is_refused_without_echoing_them() -> None:
    errors = _errors(_doc(url="https://root:hunter2@pve:8006"))
    assert errors == ["url: must not carry a user or password; the API token comes from tokenFile"]
    assert "hunter2" not in " ".join(errors)


def test_vendor_data_is_never_echoed() -> None:
    errors = _errors(_doc(vendorData=["password: hunter2"]))
    assert errors == ["vendorData: must be text when set, got a hidden value"]


def test_a_document_that_is_not_a_map() -> None:
    with pytest.raises(ConfigError) as caught:
        ProxmoxConfig.from_mapping(["url"], installation_id=INSTALLATION)  # type: ignore[arg-type]
    assert [str(e) for e in caught.value.errors] == [
        "(document): must be a map of settings, got a list"
    ]


def test_validate_applies_the_same_rules_to_a_config_built_in_code() -> None:
    good = ProxmoxConfig.from_mapping(EXAMPLE, installation_id=INSTALLATION)
    good.validate()
    bad = ProxmoxConfig(
        name="proxmox-home",
        url="https://pve",
        token_file="/t",
        nodes=("pv1", "pv1"),
        iso_storage="seeds",
        vmid_min=300,
        vmid_max=200,
        templates={"debian-13": TemplateRef(vmid=9001)},
        machine_types={"small": MachineType(cores=1, memory_mib=0)},
        installation_id="",
    )
    with pytest.raises(ConfigError) as caught:
        bad.validate()
    assert [e.path for e in caught.value.errors] == [
        "nodes[1]",
        "vmidRange",
        "machineTypes.small.memoryMiB",
        "installationId",
    ]
    assert isinstance(caught.value.errors[0], FieldError)


def test_a_config_does_not_follow_later_edits_of_the_callers_containers() -> None:
    templates = {"debian-13": TemplateRef(vmid=9001)}
    nodes = ["pv1"]
    config = ProxmoxConfig(
        name="c",
        url="https://pve",
        token_file="/t",
        nodes=nodes,  # type: ignore[arg-type]
        iso_storage="seeds",
        templates=templates,
        machine_types={"s": MachineType(1, 512)},
    )
    templates["other"] = TemplateRef(vmid=9002)
    nodes.append("pv2")
    assert list(config.templates) == ["debian-13"]
    assert config.nodes == ("pv1",)


# --- placement (entry 3) ----------------------------------------------------------------------

ONE_NODE = ProxmoxConfig.from_mapping(EXAMPLE, installation_id=INSTALLATION)
TWO_NODES = ProxmoxConfig.from_mapping(_doc(nodes=["pv1-1", "pv1-2"]), installation_id=INSTALLATION)


def test_resolve_zone() -> None:
    assert resolve_zone(ONE_NODE, "") == "pv1-1"
    assert resolve_zone(ONE_NODE, None) == "pv1-1"
    assert resolve_zone(ONE_NODE, "pv1-1") == "pv1-1"
    assert resolve_zone(TWO_NODES, "pv1-2") == "pv1-2"


@pytest.mark.parametrize(
    ("config", "zone", "message"),
    [
        (ONE_NODE, "pv9", 'placement.zone "pv9" is not in proxmox.nodes'),
        (TWO_NODES, "PV1-1", 'placement.zone "PV1-1" is not in proxmox.nodes'),
        (TWO_NODES, "", "placement.zone is required"),
    ],
)
def test_resolve_zone_refusals_are_permanent_and_say_what_to_pick(
    config: ProxmoxConfig, zone: str, message: str
) -> None:
    with pytest.raises(PermanentError) as caught:
        resolve_zone(config, zone)
    assert caught.value.message.startswith(message)
    assert "pv1-1" in caught.value.remediation


def test_resolve_machine_type_and_template() -> None:
    assert resolve_machine_type(ONE_NODE, "small") == MachineType(1, 1024, 10)
    assert resolve_template(ONE_NODE, "debian-13") == 9001
    with pytest.raises(PermanentError) as caught:
        resolve_machine_type(ONE_NODE, "huge")
    assert caught.value.message == 'placement.machineType "huge" is not in proxmox.machineTypes'
    assert "small" in caught.value.remediation and "proxmox-home" in caught.value.remediation
    with pytest.raises(PermanentError) as caught:
        resolve_template(ONE_NODE, "ubuntu")
    assert caught.value.message == 'placement.image "ubuntu" is not in proxmox.templates'
    assert "debian-13" in caught.value.remediation
    with pytest.raises(PermanentError):
        resolve_template(ONE_NODE, "")


def test_pool_is_optional_checked_and_exported() -> None:
    """Issue 14: ``pool`` (the resource pool clones join) is an optional catalogue key."""
    config = ProxmoxConfig.from_mapping(_doc(pool="proxyhub"), installation_id=INSTALLATION)
    assert config.pool == "proxyhub"
    assert config.to_mapping()["pool"] == "proxyhub"
    assert (
        "pool" not in ProxmoxConfig.from_mapping(_doc(), installation_id=INSTALLATION).to_mapping()
    )
    with pytest.raises(ConfigError) as err:
        ProxmoxConfig.from_mapping(_doc(pool="a/b c"), installation_id=INSTALLATION)
    assert str(err.value).startswith("pool: must be a Proxmox pool id")
