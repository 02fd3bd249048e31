"""The management commands of DESIGN.md §7: what an operator types and what they get back."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from pump import Pump, Sim  # the pump and sim fixtures come from conftest.py

from provisioning.management.commands import proxies as proxies_command
from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import DesiredState, OperationKind, Phase
from provisioning.services.leases import job_lease

pytestmark = pytest.mark.django_db

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
LIST_KEYS = {
    "name",
    "uid",
    "cluster",
    "phase",
    "providerId",
    "vmid",
    "node",
    "ip",
    "lastError",
    "createdAt",
    "drift",  # issue 14: added beside DESIGN.md §7's keys (adding is allowed, never removing)
    "identity",  # issue 14, seed 001: likewise added
}
PLACEMENT = ["--cluster", "pvesim", "--machine-type", "small", "--image", "debian-13"]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args: str, stdout: io.StringIO | None = None) -> tuple[str, str]:
    out, err = stdout or io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run(*args)
    return str(caught.value)


@pytest.fixture
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``wait`` without real sleeps; each pause is recorded."""
    pauses: list[float] = []
    monkeypatch.setattr(proxies_command, "_pause", pauses.append)
    return pauses


def work_while_waiting(monkeypatch: pytest.MonkeyPatch, pump: Pump) -> None:
    """Between two polls of ``wait`` the workers do their work (``wait`` itself only reads)."""
    monkeypatch.setattr(proxies_command, "_pause", lambda seconds: pump.run())


# --- import_catalogue / export_catalogue ------------------------------------------------------


@pytest.mark.usefixtures("documented_credentials_dir")
def test_import_catalogue_prints_what_it_did_and_warns_about_missing_files() -> None:
    source = str(DATA / "catalogue-two-clusters.yaml")

    out, err = run("import_catalogue", source)

    assert out.splitlines() == [
        "created cluster proxmox-home: 1 node, 1 template, 1 machine type",
        "created cluster proxmox-lab: 2 nodes, 2 templates, 2 machine types",
    ]
    assert f"warning: {source}[0].tokenFile: /etc/proxyhub/proxmox/token does not exist" in err
    assert f"{source}[1].tokenFile" in err
    assert set(Cluster.objects.values_list("name", flat=True)) == {"proxmox-home", "proxmox-lab"}

    out, _ = run("import_catalogue", source)
    assert out.splitlines() == ["unchanged cluster proxmox-home", "unchanged cluster proxmox-lab"]


@pytest.mark.usefixtures("documented_credentials_dir")
def test_import_catalogue_dry_run_writes_nothing() -> None:
    out, _ = run("import_catalogue", str(DATA / "catalogue-two-clusters.yaml"), "--dry-run")

    assert "would create cluster proxmox-home" in out and "nothing was written" in out
    assert not Cluster.objects.exists()


@pytest.mark.usefixtures("documented_credentials_dir")
def test_import_catalogue_refusal_is_a_command_error_with_paths(tmp_path: Path) -> None:
    good = str(DATA / "catalogue-two-clusters.yaml")
    bad = str(DATA / "catalogue-duplicate-keys.yaml")

    message = refused("import_catalogue", good, bad)

    assert f"{bad}[0].templates.debian-13: is given twice" in message
    assert f"{bad}[0].vlanTag: is given twice" in message
    assert not Cluster.objects.exists()


@pytest.mark.usefixtures("documented_credentials_dir")
def test_export_catalogue_prints_yaml_that_imports_back_unchanged(tmp_path: Path) -> None:
    run("import_catalogue", str(DATA / "catalogue-two-clusters.yaml"))

    out, _ = run("export_catalogue")
    path = tmp_path / "export.yaml"
    path.write_text(out)

    assert [d["name"] for d in yaml.safe_load_all(out)] == ["proxmox-home", "proxmox-lab"]
    again, _ = run("import_catalogue", str(path))
    assert again.splitlines() == [
        "unchanged cluster proxmox-home",
        "unchanged cluster proxmox-lab",
    ]
    assert "vendorData: '<sealed: use --include-secrets>'" in out
    assert "qemu-guest-agent" not in out
    with_secrets, _ = run("export_catalogue", "--include-secrets")
    assert "packages: [qemu-guest-agent]" in with_secrets
    only, _ = run("export_catalogue", "--cluster", "proxmox-lab")
    assert [d["name"] for d in yaml.safe_load_all(only)] == ["proxmox-lab"]
    assert "no cluster is named nope" in refused("export_catalogue", "--cluster", "nope")


# --- proxies create ---------------------------------------------------------------------------


def _printed_uids(out: str) -> dict[str, str]:
    return dict(line.split() for line in out.splitlines())


def test_create_by_name_prints_name_and_uid_and_keeps_cloud_init(sim: Sim, tmp_path: Path) -> None:
    user_data = b"#cloud-config\nhostname: a\n\xe2\x9c\x93 exact bytes\n"
    (tmp_path / "ud").write_bytes(user_data)

    out, _ = run(
        "proxies", "create", "alpha", "beta", *PLACEMENT, "--zone", "pve2",
        "--cloud-init", str(tmp_path / "ud"),
    )  # fmt: skip

    rows = {p.name: p for p in Proxy.objects.all()}
    assert _printed_uids(out) == {name: str(p.uid) for name, p in rows.items()}
    assert set(rows) == {"alpha", "beta"}
    assert all(p.zone == "pve2" and p.cloud_init == user_data for p in rows.values())
    assert Operation.objects.filter(kind=OperationKind.CREATE).count() == 2


def test_create_from_a_file_resolves_cloud_init_files_next_to_it(sim: Sim) -> None:
    out, _ = run("proxies", "create", "--file", str(DATA / "proxies.yaml"))

    assert list(_printed_uids(out)) == ["edge-a", "edge-b", "edge-c"]
    rows = {p.name: p for p in Proxy.objects.all()}
    assert rows["edge-a"].cloud_init == b"#cloud-config\nhostname: edge-a\n"
    assert rows["edge-b"].cloud_init == (DATA / "user-data.yaml").read_bytes()
    assert rows["edge-c"].cloud_init == b"" and rows["edge-c"].zone == "pve3"


def test_a_proxies_file_with_problems_names_each_path_and_creates_nothing(
    sim: Sim, tmp_path: Path
) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(
        yaml.safe_dump(
            [
                {"name": "ok", "cluster": "pvesim", "machineType": "small", "image": "debian-13",
                 "zone": "pve1"},
                {"name": "typo", "cluster": "pvesim", "machinetype": "small",
                 "image": "debian-13"},
                {"name": "Bad_Name", "cluster": "nope", "machineType": "small",
                 "image": "debian-13"},
                {"name": "far", "cluster": "pvesim", "machineType": "small", "image": "arch",
                 "zone": "pve9"},
            ]
        )
    )  # fmt: skip

    message = refused("proxies", "create", "--file", str(path))

    assert f"{path}[1].machinetype: is not a known key" in message
    assert f"{path}[1].machineType: is required" in message
    assert f"{path}[2].name:" in message
    assert f"{path}[2].cluster: no cluster is named nope" in message
    assert f"{path}[3].zone:" in message and f"{path}[3].image:" in message
    assert f"{path}[0]" not in message
    assert not Proxy.objects.exists()


def test_a_proxies_file_with_a_duplicate_key_is_refused(sim: Sim, tmp_path: Path) -> None:
    path = tmp_path / "proxies.yaml"
    path.write_text(
        "- name: a\n  cluster: pvesim\n  machineType: small\n  image: debian-13\n  name: b\n"
    )

    assert f"{path}[0].name: is given twice" in refused("proxies", "create", "--file", str(path))
    assert not Proxy.objects.exists()


def test_create_by_count_numbers_names_to_the_width_of_n(sim: Sim) -> None:
    out, _ = run(
        "proxies", "create", "--count", "12", "--prefix", "web", *PLACEMENT, "--zone", "pve1"
    )

    names = [f"web-{i:02d}" for i in range(1, 13)]
    assert list(_printed_uids(out)) == names
    assert sorted(Proxy.objects.values_list("name", flat=True)) == names

    message = refused("proxies", "create", "--count", "12", "--prefix", "web", *PLACEMENT)
    assert "web-01" in message and "nothing was created" in message
    assert Proxy.objects.count() == 12


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["alpha", "--cluster", "pvesim", "--machine-type", "huge", "--image", "debian-13",
          "--zone", "pve1"], '--machine-type: placement.machineType "huge"'),
        (["alpha", "--cluster", "nope", "--machine-type", "small", "--image", "debian-13"],
         "no cluster is named nope"),
        (["alpha", "Not_A_Label", *PLACEMENT, "--zone", "pve1"], "Not_A_Label: "),
        (["alpha", "--cluster", "pvesim"], "also give --machine-type, --image"),
        (["alpha", "--count", "2", "--prefix", "x", *PLACEMENT], "one way"),
        (["--file", str(DATA / "proxies.yaml"), "--cluster", "pvesim"], "drop --cluster"),
        (["--count", "3", *PLACEMENT], "--count needs --prefix"),
        (["--count", "0", "--prefix", "x", *PLACEMENT], "--count must be from 1"),
    ],
    ids=["bad-placement", "unknown-cluster", "bad-name", "missing-flags", "two-forms",
         "file-with-flags", "count-without-prefix", "zero-count"],
)  # fmt: skip
def test_create_refusals_create_nothing(sim: Sim, args: list[str], fragment: str) -> None:
    assert fragment in refused("proxies", "create", *args)
    assert not Proxy.objects.exists() and not Operation.objects.exists()


# --- proxies list -----------------------------------------------------------------------------


def test_list_json_has_exactly_the_contract_keys(pump: Pump, sim: Sim) -> None:
    pump.call(run, "proxies", "create", "alpha", *PLACEMENT, "--zone", "pve1")
    pump.run()
    run("proxies", "create", "beta", *PLACEMENT, "--zone", "pve2")

    out, _ = run("proxies", "list", "--json")

    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["alpha", "beta"]
    assert all(set(r) == LIST_KEYS for r in rows)
    alpha, beta = rows
    proxy = Proxy.objects.get(name="alpha")
    assert alpha["uid"] == str(proxy.uid) and alpha["cluster"] == "pvesim"
    assert alpha["phase"] == "Running" and alpha["ip"] == proxy.ip and alpha["node"] == "pve1"
    assert alpha["providerId"] == f"vms/{proxy.vmid}/proxy-alpha" and alpha["vmid"] == proxy.vmid
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", alpha["createdAt"])
    assert alpha["lastError"] is None
    assert alpha["identity"] == {
        "smbiosUuid": proxy.smbios_uuid,
        "vmgenid": proxy.vmgenid,
        "checkedAt": alpha["identity"]["checkedAt"],
        "mismatch": False,
    }
    assert proxy.smbios_uuid and re.fullmatch(r".+T.+Z", alpha["identity"]["checkedAt"])
    assert beta["identity"] == {
        "smbiosUuid": None,
        "vmgenid": None,
        "checkedAt": None,
        "mismatch": False,
    }
    # Nothing observed yet: null, not an empty string.
    assert beta["phase"] == "Pending"
    assert [beta[k] for k in ("providerId", "vmid", "node", "ip", "createdAt")] == [None] * 5


def test_list_prints_an_aligned_table(sim: Sim) -> None:
    run("proxies", "create", "a", "much-longer-name", *PLACEMENT, "--zone", "pve1")

    out, _ = run("proxies", "list")

    header, *rows = out.splitlines()
    assert header.split()[:3] == ["NAME", "CLUSTER", "PHASE"]
    column = header.index("PHASE")
    assert [r[column:].split()[0] for r in rows] == ["Pending", "Pending"]
    assert [r.split()[0] for r in rows] == ["a", "much-longer-name"]


# --- proxies delete ---------------------------------------------------------------------------


def test_delete_by_name_and_refusal_of_unknown_names(sim: Sim) -> None:
    run("proxies", "create", "a", "b", "c", *PLACEMENT, "--zone", "pve1")

    message = refused("proxies", "delete", "a", "nope")
    assert "nope" in message
    assert not Proxy.objects.filter(desired_state=DesiredState.DELETED).exists()

    out, _ = run("proxies", "delete", "a", "b")
    assert "a  deleting" in out and "deleting 2 proxies" in out
    states = dict(Proxy.objects.values_list("name", "desired_state"))
    assert states == {"a": "deleted", "b": "deleted", "c": "present"}
    assert Proxy.objects.get(name="a").phase == Phase.DELETING


@pytest.mark.usefixtures("documented_credentials_dir")
def test_delete_all_of_one_cluster(sim: Sim, tmp_path: Path) -> None:
    run("import_catalogue", str(DATA / "catalogue-two-clusters.yaml"))
    run("proxies", "create", "a", "b", *PLACEMENT, "--zone", "pve1")
    run("proxies", "create", "home", "--cluster", "proxmox-home", "--machine-type", "small",
        "--image", "debian-13")  # fmt: skip

    run("proxies", "delete", "--all", "--cluster", "pvesim")

    states = dict(Proxy.objects.values_list("name", "desired_state"))
    assert states == {"a": "deleted", "b": "deleted", "home": "present"}
    assert "--all" in refused("proxies", "delete")
    assert "not both" in refused("proxies", "delete", "home", "--all")


# --- proxies wait -----------------------------------------------------------------------------


def test_wait_exits_0_when_every_proxy_is_running(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    pump.call(run, "proxies", "create", "a", "b", *PLACEMENT, "--zone", "pve1")
    work_while_waiting(monkeypatch, pump)

    out, _ = run("proxies", "wait", "--phase", "Running", "--timeout", "60")

    assert out.splitlines() == ["0/2 Running", "2/2 Running"]
    assert set(Proxy.objects.values_list("phase", flat=True)) == {Phase.RUNNING}


def test_wait_shows_a_progress_bar_on_a_terminal(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    pump.call(run, "proxies", "create", "a", *PLACEMENT, "--zone", "pve1")
    work_while_waiting(monkeypatch, pump)

    out, _ = run("proxies", "wait", "a", "--phase", "Running", stdout=Tty())

    assert "\r[" in out and "1/1 Running" in out and "0/1 Running\n" not in out


def test_wait_times_out_with_exit_1_naming_the_laggards(sim: Sim, quick_polls: list[float]) -> None:
    run("proxies", "create", "a", "b", *PLACEMENT, "--zone", "pve1")

    with pytest.raises(CommandError) as caught:
        run("proxies", "wait", "a", "b", "--phase", "Running", "--timeout", "0")

    assert caught.value.returncode == 1
    assert "timed out" in str(caught.value) and "a (Pending)" in str(caught.value)


def test_wait_polls_until_the_timeout(sim: Sim, quick_polls: list[float]) -> None:
    run("proxies", "create", "a", *PLACEMENT, "--zone", "pve1")

    with pytest.raises(CommandError):
        run("proxies", "wait", "--phase", "Running", "--timeout", "0.3")

    # It polled every half second (at most) until the timeout; it never ended early.
    assert quick_polls and all(0 <= p <= proxies_command.POLL_SECONDS for p in quick_polls)


def test_wait_exits_1_when_a_proxy_fails(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.engine.control.deny("/vms", "VM.PowerMgmt")  # the start step fails permanently
    pump.call(run, "proxies", "create", "a", *PLACEMENT, "--zone", "pve1")
    work_while_waiting(monkeypatch, pump)

    with pytest.raises(CommandError) as caught:
        run("proxies", "wait", "a", "--phase", "Running", "--timeout", "60")

    assert caught.value.returncode == 1
    assert "Failed" in str(caught.value) and "a: " in str(caught.value)
    assert Proxy.objects.get().phase == Phase.FAILED


def test_wait_for_deleted_waits_until_the_proxies_are_gone(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    pump.call(run, "proxies", "create", "a", "b", *PLACEMENT, "--zone", "pve1")
    pump.run()
    pump.call(run, "proxies", "delete", "a", "b")
    work_while_waiting(monkeypatch, pump)

    out, _ = run("proxies", "wait", "a", "b", "--phase", "Deleted")

    assert out.splitlines()[-1] == "2/2 Deleted"
    assert not Proxy.objects.exists()
    names = {e.get("name") for e in sim.api.cluster_resources()}
    assert not names & {"proxy-a", "proxy-b"}


def test_wait_refuses_unknown_names(sim: Sim, quick_polls: list[float]) -> None:
    assert "nope" in refused("proxies", "wait", "nope", "--phase", "Running")
    # A proxy that does not exist is already deleted.
    out, _ = run("proxies", "wait", "nope", "--phase", "Deleted")
    assert out.splitlines() == ["1/1 Deleted"]


# --- proxies start / shutdown / reboot --------------------------------------------------------


def test_power_actions_run_as_journalled_operations(pump: Pump, sim: Sim) -> None:
    pump.call(run, "proxies", "create", "a", *PLACEMENT, "--zone", "pve1")
    pump.run()

    out, _ = pump.call(run, "proxies", "shutdown", "a")
    pump.run()
    assert "a  shutdown  operation" in out
    assert Proxy.objects.get().phase == Phase.STOPPED

    pump.call(run, "proxies", "start", "a")
    pump.run()
    kinds = list(Operation.objects.order_by("created_at").values_list("kind", "state"))
    assert kinds[-2:] == [("shutdown", "succeeded"), ("start", "succeeded")]
    assert Proxy.objects.get().phase in (Phase.PROVISIONING, Phase.RUNNING)


def test_power_is_refused_for_all_when_one_is_still_being_created(pump: Pump, sim: Sim) -> None:
    pump.call(run, "proxies", "create", "a", *PLACEMENT, "--zone", "pve1")
    pump.run()
    run("proxies", "create", "b", *PLACEMENT, "--zone", "pve1")
    before = Operation.objects.count()

    message = refused("proxies", "reboot", "a", "b")

    # b's create still runs: a power action between its steps is refused.
    assert "b is being created" in message and "nothing was done" in message
    assert Operation.objects.count() == before


# --- gc and reconcile -------------------------------------------------------------------------


def _orphan_a_vm(pump: Pump) -> Proxy:
    """A VM of ours whose proxy row is gone (as after a restore of an old database)."""
    pump.call(run, "proxies", "create", "lost", *PLACEMENT, "--zone", "pve1")
    pump.run()
    proxy = Proxy.objects.get()
    Proxy.objects.filter(pk=proxy.pk).delete()
    return proxy


def test_gc_dry_run_json_lists_the_orphan_and_writes_nothing(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_GC_MIN_AGE_SECONDS = 0
    orphan = _orphan_a_vm(pump)
    mutations, operations = sim.ledger_mutations(), Operation.objects.count()

    out, _ = pump.call(run, "gc", "--dry-run", "--json")

    items = json.loads(out)
    assert [(i["kind"], i["name"], i["vmid"], i["uid"]) for i in items] == [
        ("vm", "proxy-lost", orphan.vmid, str(orphan.uid))
    ]
    assert pump.queue == [] and Operation.objects.count() == operations
    assert sim.ledger_mutations() == mutations

    out, _ = pump.call(run, "gc")
    pump.run()
    assert "removing VM" in out
    assert not [e for e in sim.api.cluster_resources() if e.get("name") == "proxy-lost"]


def test_gc_and_reconcile_exit_1_while_another_holds_the_lease(sim: Sim) -> None:
    for job, command in (("gc", "gc"), ("reconcile", "reconcile")):
        with job_lease(job, seconds=60), pytest.raises(CommandError) as caught:
            run(command)
        assert caught.value.returncode == 1 and "already running" in str(caught.value)


def test_reconcile_prints_its_counts(pump: Pump, sim: Sim) -> None:
    pump.call(run, "proxies", "create", "a", "b", *PLACEMENT, "--zone", "pve1")
    pump.run()
    # The first round after a create reads each VM's identity once more when the listing
    # shows it started after the configure's read (reconcile._started_since_identity_read);
    # whether it does depends on the listing's uptime having reached a second. Wait for that,
    # so the counts below do not depend on how fast the machine ran the creates.
    give_up = time.monotonic() + 10
    while not all(
        (e.get("uptime") or 0) > 0
        for e in sim.api.cluster_resources()
        if e.get("name") in ("proxy-a", "proxy-b")
    ):
        assert time.monotonic() < give_up, "the VMs never showed an uptime"
        time.sleep(0.05)

    first, _ = pump.call(run, "reconcile")
    again, _ = pump.call(run, "reconcile")

    assert first.strip() == "reconcile: drift_checked 2"
    assert again.strip() == "reconcile: converged 2"


# --- pvesim -----------------------------------------------------------------------------------


@pytest.fixture
def pvesim(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "PROXYHUB_VAR_DIR": str(tmp_path / "var")}
    process = subprocess.Popen(
        [sys.executable, "manage.py", "pvesim", "--port", "0", "--profile", "instant",
         "--workdir", str(tmp_path / "sim")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        yield json.loads(line)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert process.stdout is not None and process.stdout.read() == ""  # one line only


def test_pvesim_prints_one_json_line_whose_catalogue_imports(pvesim: dict[str, str]) -> None:
    assert set(pvesim) == {"url", "tokenFile", "caFile", "catalogue"}
    assert pvesim["url"].startswith("https://127.0.0.1:")

    out, err = run("import_catalogue", pvesim["catalogue"])

    assert out.startswith("created cluster pvesim") and err == ""
    cluster = Cluster.objects.get(name="pvesim")
    assert cluster.url == pvesim["url"] and cluster.ca_file == pvesim["caFile"]
    assert cluster.templates.filter(key="debian-13").exists()
