"""The catalogue import and export (DESIGN.md §7, seed 000 entries 14 and 15)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioning.models import Cluster, MachineType, Node, Proxy, Template
from provisioning.services.catalogue import (
    VENDOR_DATA_PLACEHOLDER,
    CatalogueError,
    catalogue_load,
)
from provisioning.services.catalogue_export import catalogue_export
from provisioning.services.catalogue_import import catalogue_import

pytestmark = pytest.mark.django_db

DATA = Path(__file__).parent / "data"


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text("proxyhub@pve!cat=00000000-0000-0000-0000-000000000000\n")
    return str(path)


def _doc(token_file: str, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "proxyhub/v1",
        "kind": "ProxmoxCluster",
        "name": "proxmox-home",
        "url": "https://192.168.0.8:8006",
        "tokenFile": token_file,
        "nodes": ["pv1-3", "pv1-1", "pv1-2"],
        "isoStorage": "proxy-seeds",
        "vlanTag": 4,
        "templates": {"debian-13": {"vmid": 9001}, "alpine-3": {"vmid": 9002}},
        "machineTypes": {
            "small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10},
            "large": {"cores": 4, "memoryMiB": 8192},
        },
    }
    doc.update(overrides)
    return doc


def _write(tmp_path: Path, *docs: dict[str, Any], name: str = "catalogue.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def _import_file(tmp_path: Path, *docs: dict[str, Any], dry_run: bool = False) -> Any:
    return catalogue_import(catalogue_load([_write(tmp_path, *docs)]), dry_run=dry_run)


def _snapshot() -> dict[str, Any]:
    """Everything the catalogue tables hold, to show that a refused import wrote nothing."""
    return {
        "clusters": list(Cluster.objects.order_by("name").values()),
        "nodes": list(Node.objects.order_by("cluster__name", "name").values()),
        "templates": list(Template.objects.order_by("cluster__name", "key").values()),
        "machine_types": list(MachineType.objects.order_by("cluster__name", "key").values()),
    }


def _proxy(cluster: Cluster, name: str, **fields: Any) -> Proxy:
    values = {"zone": "pv1-1", "machine_type": "small", "image": "debian-13"}
    values.update(fields)
    return Proxy.objects.create(name=name, cluster=cluster, **values)


# --- happy paths ------------------------------------------------------------------------------


def test_import_creates_the_cluster_with_its_children_in_config_order(
    tmp_path: Path, token_file: str
) -> None:
    report = _import_file(tmp_path, _doc(token_file))

    assert report.created == ["proxmox-home"] and report.warnings == ()
    cluster = Cluster.objects.get(name="proxmox-home")
    assert (cluster.url, cluster.token_file, cluster.iso_storage) == (
        "https://192.168.0.8:8006",
        token_file,
        "proxy-seeds",
    )
    # Entry 15's defaults for what the document leaves out.
    assert (cluster.vmid_min, cluster.vmid_max) == (100000, 199999)
    assert cluster.request_timeout_seconds == 30.0 and cluster.install_guest_agent
    assert cluster.vlan_tag == 4 and cluster.ca_file == "" and cluster.storage == ""
    nodes = list(cluster.nodes.order_by("position").values_list("name", flat=True))
    assert nodes == ["pv1-3", "pv1-1", "pv1-2"]
    assert dict(cluster.templates.values_list("key", "vmid")) == {
        "debian-13": 9001,
        "alpine-3": 9002,
    }
    sizes = {m.key: (m.cores, m.memory_mib, m.disk_gib) for m in cluster.machine_types.all()}
    assert sizes == {"small": (1, 1024, 10), "large": (4, 8192, None)}


@pytest.mark.usefixtures("documented_credentials_dir")
def test_several_documents_in_one_file_import_together() -> None:
    report = catalogue_import(catalogue_load([str(DATA / "catalogue-two-clusters.yaml")]))

    assert report.created == ["proxmox-home", "proxmox-lab"]
    lab = Cluster.objects.get(name="proxmox-lab")
    assert lab.vendor_data == "#cloud-config\npackages: [qemu-guest-agent]\n"
    assert lab.request_timeout_seconds == 12.5 and not lab.install_guest_agent
    assert list(lab.nodes.order_by("position").values_list("name", flat=True)) == ["lab-2", "lab-1"]


def test_reimport_updates_the_cluster_and_replaces_its_children(
    tmp_path: Path, token_file: str
) -> None:
    _import_file(tmp_path, _doc(token_file))
    before = Cluster.objects.get()
    changed = _doc(
        token_file,
        url="https://pve.home.lab:8006",
        nodes=["pv1-1", "pv1-4", "pv1-3"],
        templates={"debian-13": {"vmid": 9100}, "debian-14": {"vmid": 9200}},
        machineTypes={"small": {"cores": 2, "memoryMiB": 2048, "diskGiB": 20}},
    )
    del changed["vlanTag"]

    report = _import_file(tmp_path, changed)

    cluster = Cluster.objects.get()
    assert cluster.pk == before.pk and report.updated == ["proxmox-home"]
    assert cluster.updated_at > before.updated_at  # the provider cache keys on it
    assert cluster.url == "https://pve.home.lab:8006" and cluster.vlan_tag is None
    nodes = list(cluster.nodes.order_by("position").values_list("name", flat=True))
    assert nodes == ["pv1-1", "pv1-4", "pv1-3"]
    assert dict(cluster.templates.values_list("key", "vmid")) == {
        "debian-13": 9100,
        "debian-14": 9200,
    }
    assert list(cluster.machine_types.values_list("key", "cores", "memory_mib", "disk_gib")) == [
        ("small", 2, 2048, 20)
    ]
    summary = report.clusters[0].summary()
    for fragment in ("url", "vlanTag", "nodes +pv1-4 -pv1-2", "-alpine-3", "~debian-13", "-large"):
        assert fragment in summary


def test_reimporting_the_same_document_changes_nothing(tmp_path: Path, token_file: str) -> None:
    _import_file(tmp_path, _doc(token_file))
    before = _snapshot()

    report = _import_file(tmp_path, _doc(token_file))

    assert report.unchanged == ["proxmox-home"] and report.clusters[0].changes == ()
    assert _snapshot() == before  # updated_at included: no needless provider rebuild


def test_dry_run_reports_and_writes_nothing(tmp_path: Path, token_file: str) -> None:
    report = _import_file(tmp_path, _doc(token_file), dry_run=True)

    assert report.dry_run and report.created == ["proxmox-home"]
    assert "would create cluster proxmox-home" in report.clusters[0].summary(dry_run=True)
    assert not Cluster.objects.exists()


def test_removing_entries_no_live_proxy_uses_is_allowed(tmp_path: Path, token_file: str) -> None:
    _import_file(tmp_path, _doc(token_file))
    cluster = Cluster.objects.get()
    _proxy(cluster, "keeps", zone="pv1-1", machine_type="small", image="debian-13")
    gone = _proxy(cluster, "going", zone="pv1-2", machine_type="large", image="alpine-3")
    gone.desired_state = "deleted"  # being deleted: its VM is found by id, not by placement
    gone.save()

    doc = _doc(
        token_file,
        nodes=["pv1-1"],
        templates={"debian-13": {"vmid": 9001}},
        machineTypes={"small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10}},
    )
    report = _import_file(tmp_path, doc)

    assert report.updated == ["proxmox-home"]
    assert list(cluster.nodes.values_list("name", flat=True)) == ["pv1-1"]


# --- refusals ---------------------------------------------------------------------------------


def _without(doc: dict[str, Any], key: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    del doc[key]
    return doc


REFUSALS = [
    pytest.param(
        lambda d: {**d, "vlanTags": 4},
        "[0].vlanTags",
        "is not a known key",
        id="unknown-top-key",
    ),
    pytest.param(
        lambda d: {**d, "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024, "cpu": 2}}},
        "[0].machineTypes.small.cpu",
        "is not a known key",
        id="unknown-nested-key",
    ),
    pytest.param(
        lambda d: {**d, "vlanTag": 4095}, "[0].vlanTag", "from 1 to 4094", id="vlan-out-of-range"
    ),
    pytest.param(
        lambda d: {**d, "templates": {"debian-13": {"vmid": 99}}},
        "[0].templates.debian-13.vmid",
        "from 100",
        id="template-vmid-too-small",
    ),
    pytest.param(
        lambda d: {**d, "vmidRange": {"min": 200000, "max": 100000}},
        "[0].vmidRange",
        "min must be below max",
        id="vmid-range-reversed",
    ),
    pytest.param(
        lambda d: {**d, "machineTypes": {"huge": {"cores": 40000, "memoryMiB": 1024}}},
        "[0].machineTypes.huge.cores",
        "at most 32767",
        id="cores-beyond-the-column",
    ),
    pytest.param(
        lambda d: {**d, "nodes": ["n" * 64]},
        "[0].nodes[0]",
        "at most 63 characters",
        id="node-name-beyond-the-column",
    ),
    pytest.param(
        lambda d: {**d, "url": "http://192.168.0.8:8006"}, "[0].url", "https URL", id="plain-http"
    ),
    pytest.param(
        lambda d: _without(d, "isoStorage"), "[0].isoStorage", "is required", id="missing"
    ),
    pytest.param(
        lambda d: {**d, "apiVersion": "proxyhub/v2"},
        "[0].apiVersion",
        "must be proxyhub/v1",
        id="wrong-api-version",
    ),
    pytest.param(
        lambda d: _without(d, "apiVersion"), "[0].apiVersion", "is required", id="no-api-version"
    ),
    pytest.param(
        lambda d: {**d, "kind": "ProxmoxNode"},
        "[0].kind",
        "must be ProxmoxCluster",
        id="wrong-kind",
    ),
]


@pytest.mark.parametrize(("mutate", "path", "message"), REFUSALS)
def test_a_refused_document_names_the_path_and_nothing_is_written(
    tmp_path: Path, token_file: str, mutate: Any, path: str, message: str
) -> None:
    # A good cluster in another file shows that one refusal stops the whole import.
    good = _write(tmp_path, _doc(token_file, name="proxmox-ok"), name="good.yaml")
    bad = _write(tmp_path, mutate(_doc(token_file)), name="bad.yaml")

    with pytest.raises(CatalogueError) as caught:
        catalogue_import(catalogue_load([good, bad]))

    problems = {p.path: p.message for p in caught.value.problems}
    assert f"{bad}{path}" in problems, problems
    assert message in problems[f"{bad}{path}"]
    assert "nothing was written" in str(caught.value)
    assert not Cluster.objects.exists()


def test_every_problem_of_every_document_is_listed_at_once(tmp_path: Path, token_file: str) -> None:
    first = _doc(token_file, vlanTag=0, bridge="vmbr 0")
    second = _doc(token_file, name="proxmox-b", kind="Cluster", machineTypes={})
    path = _write(tmp_path, first, second)

    with pytest.raises(CatalogueError) as caught:
        catalogue_import(catalogue_load([path]))

    paths = {p.path for p in caught.value.problems}
    assert {f"{path}[0].vlanTag", f"{path}[0].bridge"} <= paths
    assert {f"{path}[1].kind", f"{path}[1].machineTypes"} <= paths


def test_two_documents_with_one_name_are_refused(tmp_path: Path, token_file: str) -> None:
    path = _write(tmp_path, _doc(token_file), _doc(token_file, url="https://other:8006"))

    with pytest.raises(CatalogueError) as caught:
        catalogue_import(catalogue_load([path]))

    [problem] = caught.value.problems
    assert problem.path == f"{path}[1].name" and f"{path}[0]" in problem.message
    assert not Cluster.objects.exists()


def test_duplicate_keys_are_refused_with_file_document_and_key_path(tmp_path: Path) -> None:
    source = str(DATA / "catalogue-duplicate-keys.yaml")
    second = tmp_path / "second.yaml"
    second.write_text(
        "apiVersion: proxyhub/v1\nkind: ProxmoxCluster\nname: a\n---\n"
        "apiVersion: proxyhub/v1\nkind: ProxmoxCluster\nname: b\nname: c\n"
    )

    with pytest.raises(CatalogueError) as caught:
        catalogue_load([source, str(second)])

    problems = {p.path: p.message for p in caught.value.problems}
    assert set(problems) == {
        f"{source}[0].templates.debian-13",
        f"{source}[0].vlanTag",
        f"{second}[1].name",
    }
    assert "lines 9 and 10" in problems[f"{source}[0].templates.debian-13"]
    assert "twice" in problems[f"{second}[1].name"]
    assert not Cluster.objects.exists()


def test_more_than_128_templates_are_refused_and_128_are_accepted(
    tmp_path: Path, token_file: str
) -> None:
    many = {f"image-{i}": {"vmid": 9000 + i} for i in range(129)}

    with pytest.raises(CatalogueError) as caught:
        _import_file(tmp_path, _doc(token_file, templates=many))
    [problem] = caught.value.problems
    assert problem.path.endswith("[0].templates") and "at most 128" in problem.message
    assert not Cluster.objects.exists()

    del many["image-128"]
    _import_file(tmp_path, _doc(token_file, templates=many))
    assert Template.objects.count() == 128


def test_more_than_128_machine_types_are_refused(tmp_path: Path, token_file: str) -> None:
    many = {f"size-{i}": {"cores": 1, "memoryMiB": 1024} for i in range(129)}

    with pytest.raises(CatalogueError) as caught:
        _import_file(tmp_path, _doc(token_file, machineTypes=many))

    assert [p.path.split("]", 1)[1] for p in caught.value.problems] == [".machineTypes"]


@pytest.mark.parametrize(
    ("change", "path", "value", "field"),
    [
        ({"templates": {"alpine-3": {"vmid": 9002}}}, "templates", "debian-13", "image"),
        (
            {"machineTypes": {"large": {"cores": 4, "memoryMiB": 8192}}},
            "machineTypes",
            "small",
            "machine_type",
        ),
        ({"nodes": ["pv1-2", "pv1-3"]}, "nodes", "pv1-1", "zone"),
    ],
    ids=["template", "machine-type", "node"],
)
def test_removing_what_a_proxy_uses_is_refused_naming_the_proxies(
    tmp_path: Path, token_file: str, change: dict[str, Any], path: str, value: str, field: str
) -> None:
    _import_file(tmp_path, _doc(token_file))
    cluster = Cluster.objects.get()
    for name in ("web-2", "web-1"):
        _proxy(cluster, name, **{field: value})
    before = _snapshot()

    for dry_run in (True, False):
        with pytest.raises(CatalogueError) as caught:
            _import_file(
                tmp_path, _doc(token_file, url="https://elsewhere:8006", **change), dry_run=dry_run
            )
        [problem] = caught.value.problems
        assert problem.path.endswith(f"[0].{path}")
        assert f'"{value}"' in problem.message and "web-1, web-2" in problem.message
    assert _snapshot() == before


def test_yaml_syntax_errors_name_the_line_and_never_echo_the_text(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(
        "apiVersion: proxyhub/v1\nkind: ProxmoxCluster\n"
        "vendorData: 'password: hunter2-sentinel\nnodes: [a, b\n"
    )

    with pytest.raises(CatalogueError) as caught:
        catalogue_load([str(path)])

    text = str(caught.value)
    assert str(path) in text and "line" in text
    assert "hunter2-sentinel" not in text


def test_a_missing_file_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")

    with pytest.raises(CatalogueError) as caught:
        catalogue_load([str(tmp_path / "absent.yaml"), str(empty)])

    messages = {p.path: p.message for p in caught.value.problems}
    assert "cannot be read" in messages[str(tmp_path / "absent.yaml")]
    assert "holds no document" in messages[str(empty)]


# --- warnings ---------------------------------------------------------------------------------


def test_a_token_file_that_does_not_exist_yet_imports_with_a_warning(tmp_path: Path) -> None:
    """Seed 000 entry 14: the token is read on every request, so it may land later."""
    token = tmp_path / "later" / "token"
    ca = tmp_path / "later" / "ca.pem"

    report = _import_file(tmp_path, _doc(str(token), caFile=str(ca)))

    assert report.created == ["proxmox-home"]
    assert Cluster.objects.get().token_file == str(token)
    [token_warning] = [w for w in report.warnings if ".tokenFile:" in w]
    assert str(token) in token_warning and "does not exist yet" in token_warning
    assert any(".caFile:" in w and str(ca) in w for w in report.warnings)


def test_skipping_tls_verification_is_a_warning(tmp_path: Path, token_file: str) -> None:
    report = _import_file(tmp_path, _doc(token_file, insecureSkipTLSVerify=True))

    assert Cluster.objects.get().insecure_skip_tls_verify
    assert any("insecureSkipTLSVerify" in w for w in report.warnings)


# --- export -----------------------------------------------------------------------------------


def test_export_round_trips_through_import(tmp_path: Path, token_file: str) -> None:
    full = _doc(
        token_file,
        caFile=token_file,
        storage="local-lvm",
        bridge="vmbr1",
        pool="proxyhub",  # issue 14: optional, proxyhub's own key
        vmidRange={"min": 300000, "max": 300999},
        requestTimeoutSeconds=7.5,
        vendorData="#cloud-config\nruncmd:\n  - [touch, /x]\n",
        installGuestAgent=False,
    )
    _import_file(tmp_path, full, _doc(token_file, name="proxmox-lab", nodes=["lab-1"]))
    configs = {c.name: c.proxmox_config("x") for c in Cluster.objects.all()}
    before = _snapshot()

    exported = catalogue_export()
    path = tmp_path / "exported.yaml"
    path.write_text(exported)
    report = catalogue_import(catalogue_load([str(path)]))

    assert report.unchanged == ["proxmox-home", "proxmox-lab"]
    assert _snapshot() == before
    # With its secrets, an export recreates the catalogue from nothing.
    full_export = catalogue_export(include_secrets=True)
    path.write_text(full_export)
    Cluster.objects.all().delete()
    catalogue_import(catalogue_load([str(path)]))
    assert {c.name: c.proxmox_config("x") for c in Cluster.objects.all()} == configs
    assert "vendorData: |" in full_export  # multi-line text reads as a block
    assert Cluster.objects.get(name="proxmox-home").pool == "proxyhub"
    assert Cluster.objects.get(name="proxmox-lab").pool == ""  # unset stays unset
    assert "pool:" not in full_export.split("name: proxmox-lab", 1)[1]


VENDOR_CANARY = "vendor-canary-5e1d0c"


def test_vendor_data_is_sealed_at_rest_and_exported_only_on_request(
    tmp_path: Path, token_file: str
) -> None:
    vendor = f"#cloud-config\nwrite_files:\n  - content: {VENDOR_CANARY}\n"
    _import_file(tmp_path, _doc(token_file, vendorData=vendor))
    cluster = Cluster.objects.get()

    assert VENDOR_CANARY.encode() not in bytes(cluster.vendor_data_sealed)
    assert cluster.vendor_data == vendor  # the provider still gets the clear text
    assert cluster.proxmox_config("x").vendor_data == vendor
    exported = catalogue_export()
    assert VENDOR_CANARY not in exported
    assert yaml.safe_load(exported)["vendorData"] == VENDOR_DATA_PLACEHOLDER
    assert VENDOR_CANARY in catalogue_export(include_secrets=True)


def test_importing_the_placeholder_keeps_the_stored_vendor_data(
    tmp_path: Path, token_file: str
) -> None:
    vendor = f"#cloud-config\nruncmd: [[echo, {VENDOR_CANARY}]]\n"
    _import_file(tmp_path, _doc(token_file, vendorData=vendor))
    path = tmp_path / "exported.yaml"
    path.write_text(catalogue_export())

    report = catalogue_import(catalogue_load([str(path)]))

    assert report.unchanged == ["proxmox-home"]
    assert Cluster.objects.get().vendor_data == vendor


def test_the_placeholder_for_a_new_cluster_is_refused_and_nothing_is_written(
    tmp_path: Path, token_file: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_doc(token_file, vendorData=VENDOR_DATA_PLACEHOLDER)))

    with pytest.raises(CatalogueError, match=r"\.vendorData: is the placeholder of an export"):
        catalogue_import(catalogue_load([str(path)]))
    assert not Cluster.objects.exists()


def test_export_of_named_clusters_and_of_an_unknown_one(tmp_path: Path, token_file: str) -> None:
    _import_file(tmp_path, _doc(token_file), _doc(token_file, name="proxmox-lab"))

    documents = list(yaml.safe_load_all(catalogue_export(["proxmox-lab"])))

    assert [d["name"] for d in documents] == ["proxmox-lab"]
    assert documents[0]["apiVersion"] == "proxyhub/v1" and documents[0]["kind"] == "ProxmoxCluster"
    with pytest.raises(CatalogueError, match="no cluster is named nope"):
        catalogue_export(["proxmox-lab", "nope"])


@pytest.mark.parametrize(("value", "bound"), [(None, 30.0), (0, 0.0), (12.5, 12.5)])
def test_request_timeout_has_one_meaning_from_the_catalogue_to_the_transport(
    tmp_path: Path, token_file: str, value: float | None, bound: float
) -> None:
    """``requestTimeoutSeconds``: absent is 30 s; 0 is no per-request bound (the seed's
    ``http.Client.Timeout``), as docs/catalogue.md says, not 30 s by the back door; the step's
    task time limit still ends a request that never answers."""
    from provisioning.proxmox.http import HttpTransport
    from provisioning.services.providers import _http_transport

    overrides = {} if value is None else {"requestTimeoutSeconds": value}
    _import_file(tmp_path, _doc(token_file, **overrides))
    cluster = Cluster.objects.get(name="proxmox-home")
    transport = _http_transport(cluster.proxmox_config("inst"))
    assert isinstance(transport, HttpTransport)
    assert transport.request_timeout == bound
    transport.close()


def test_the_drift_policy_imports_exports_and_is_refused_when_unknown(
    tmp_path: Path, token_file: str
) -> None:
    """Issue 14: ``driftPolicy`` is ``report`` (the default) or ``repair``; anything else is
    refused with its path and what is allowed, and nothing is written."""
    _import_file(tmp_path, _doc(token_file))
    assert Cluster.objects.get().drift_policy == "report"

    report = _import_file(tmp_path, _doc(token_file, driftPolicy="repair"))
    assert "driftPolicy" in report.clusters[0].summary()
    assert Cluster.objects.get().drift_policy == "repair"
    assert "driftPolicy: repair" in catalogue_export()

    bad = _write(tmp_path, _doc(token_file, driftPolicy="fix"), name="bad.yaml")
    with pytest.raises(CatalogueError) as caught:
        catalogue_import(catalogue_load([bad]))
    problems = {p.path: p.message for p in caught.value.problems}
    assert problems[f"{bad}[0].driftPolicy"] == 'must be report or repair, got "fix"'
    assert Cluster.objects.get().drift_policy == "repair"  # nothing written


# --- issue 14: seed 003's template declaration and per-node copies --------------------------

DECLARED = {
    "vmid": 9001,
    "templateVersion": "debian-13-cloud-20261016",
    "diskDevice": "scsi0",
    "sourceDiskGiB": 8,
    "guestUser": "debian",
    "copies": {"pv1-1": 9002, "pv1-2": 9003},
    "waitForCloudInit": True,
}


def test_a_template_declaration_imports_exports_and_round_trips(
    tmp_path: Path, token_file: str
) -> None:
    _import_file(tmp_path, _doc(token_file, templates={"debian-13": DECLARED}))
    row = Template.objects.get(key="debian-13")
    assert (row.template_version, row.disk_device, row.source_disk_gib, row.guest_user) == (
        "debian-13-cloud-20261016",
        "scsi0",
        8,
        "debian",
    )
    assert row.copies == {"pv1-1": 9002, "pv1-2": 9003}
    assert row.wait_for_cloud_init is True
    exported = yaml.safe_load(catalogue_export())
    assert exported["templates"]["debian-13"] == DECLARED
    path = tmp_path / "exported.yaml"
    path.write_text(catalogue_export())
    assert catalogue_import(catalogue_load([str(path)])).unchanged == ["proxmox-home"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("templateVersion", "has space", "letters, digits, dots"),
        ("diskDevice", "ide0", "one of scsi0, virtio0, sata0"),
        ("sourceDiskGiB", 2, "an integer from 4 to 4096"),
        ("guestUser", "root", "not root"),
        ("copies", {"nowhere": 9005}, "a node of this cluster"),
        ("waitForCloudInit", 1, "true or false"),
        ("colour", "blue", ""),
    ],
)
def test_a_bad_declaration_is_refused_with_its_path_and_nothing_is_written(
    tmp_path: Path, token_file: str, field: str, value: Any, message: str
) -> None:
    entry = {**DECLARED, field: value}
    with pytest.raises(CatalogueError) as caught:
        _import_file(tmp_path, _doc(token_file, templates={"debian-13": entry}))
    paths = {p.path.split(".yaml", 1)[1]: p.message for p in caught.value.problems}
    where = f"[0].templates.debian-13.{field}" + (".nowhere" if field == "copies" else "")
    assert where in paths, paths
    assert message in paths[where]
    assert not Cluster.objects.exists()
