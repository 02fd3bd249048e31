"""Issue 11, "Credentials and where they may go", where a person names the files.

Import, the admin form and preflight refuse a tokenFile or caFile outside
PROXYHUB_CREDENTIALS_DIR (or not a regular file, or too large) with a message naming the field,
and write nothing. Changing the endpoint needs ``change_cluster_endpoint``; the CA trusted for
the url is recorded, shown by its fingerprint only, and a new url clears it. ``proxies create
--file`` reads cloudInitFile only from beside the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from pump import Sim
from test_admin_clusters import CLUSTERS, _as_saved
from test_admin_support import OPERATOR, People, people_fixture  # noqa: F401

from provisioning.models import Cluster, Proxy
from provisioning.proxmox.credentials import ca_fingerprint, load_ca
from provisioning.services.catalogue import CatalogueError, catalogue_load
from provisioning.services.catalogue_import import catalogue_import
from provisioning.services.operations import CLOUD_INIT_MAX_BYTES

pytestmark = pytest.mark.django_db

TOKEN = "proxyhub@pve!sim=5f0c6a1e-0b7d-4c8e-9a55-3f1d2e4b6c70\n"


@pytest.fixture
def creds(tmp_path: Path, settings: Any) -> Path:
    """A credentials directory of its own, with a token and a CA in it."""
    root = tmp_path / "creds"
    root.mkdir()
    (root / "token").write_text(TOKEN)
    (root / "ca.pem").write_bytes(trustme.CA().cert_pem.bytes())
    (tmp_path / "secret").write_text(TOKEN)
    settings.PROXYHUB_CREDENTIALS_DIR = str(root)
    return root


def _document(creds: Path, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "proxyhub/v1",
        "kind": "ProxmoxCluster",
        "name": "proxmox-home",
        "url": "https://pve1.example:8006",
        "tokenFile": str(creds / "token"),
        "caFile": str(creds / "ca.pem"),
        "nodes": ["pve1"],
        "isoStorage": "proxy-seeds",
        "templates": {"debian-13": {"vmid": 9000}},
        "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024}},
    }
    doc.update(overrides)
    return doc


def _import(tmp_path: Path, doc: dict[str, Any]) -> Any:
    path = tmp_path / "catalogue.yaml"
    path.write_text(yaml.safe_dump(doc))
    return catalogue_import(catalogue_load([str(path)]))


def _fifo(creds: Path) -> str:
    os.mkfifo(creds / "fifo")
    return str(creds / "fifo")


def _symlink_out(creds: Path) -> str:
    (creds / "link").symlink_to(creds.parent / "secret")
    return str(creds / "link")


def _oversize(creds: Path) -> str:
    (creds / "big.pem").write_bytes(b"x" * (1024 * 1024 + 1))
    return str(creds / "big.pem")


BAD_PATHS = {
    "etc-hostname": lambda c: "/etc/hostname",
    "outside": lambda c: str(c.parent / "secret"),
    "dot-dot": lambda c: f"{c}/../secret",
    "symlink-out": _symlink_out,
    "fifo": _fifo,
    "dev-zero": lambda c: "/dev/zero",
    "directory": lambda c: str(c),
    "oversize": _oversize,
}


@pytest.mark.parametrize("key", ["tokenFile", "caFile"])
@pytest.mark.parametrize("case", sorted(BAD_PATHS))
def test_import_refuses_a_credentials_path_naming_the_field_and_writes_nothing(
    tmp_path: Path, creds: Path, key: str, case: str
) -> None:
    with pytest.raises(CatalogueError) as refused:
        _import(tmp_path, _document(creds, **{key: BAD_PATHS[case](creds)}))
    paths = [p.path for p in refused.value.problems]
    assert paths == [f"{tmp_path / 'catalogue.yaml'}[0].{key}"]
    assert "PROXYHUB_CREDENTIALS_DIR" in str(refused.value)
    assert not Cluster.objects.exists()


def test_import_records_the_ca_fingerprint_and_a_new_url_does_not_inherit_it(
    tmp_path: Path, creds: Path
) -> None:
    _import(tmp_path, _document(creds))
    cluster = Cluster.objects.get()
    expected = ca_fingerprint(load_ca(str(creds / "ca.pem"), root=str(creds)))
    assert cluster.ca_fingerprint == expected
    assert cluster.proxmox_config("x").ca_fingerprint == expected
    assert _import(tmp_path, _document(creds)).unchanged == ["proxmox-home"]

    # The CA file is gone when the url changes: no trust is carried to the new host.
    (creds / "ca.pem").unlink()
    _import(tmp_path, _document(creds, url="https://elsewhere.example:8006"))
    assert Cluster.objects.get().ca_fingerprint == ""


def test_saving_a_new_url_clears_the_trusted_ca(tmp_path: Path, creds: Path) -> None:
    _import(tmp_path, _document(creds))
    cluster = Cluster.objects.get()
    cluster.vlan_tag = 7
    cluster.save()
    assert Cluster.objects.get().ca_fingerprint != ""
    cluster.url = "https://attacker.example:8006"
    cluster.save()
    assert Cluster.objects.get().ca_fingerprint == ""


@pytest.fixture
def editor(people: People, django_user_model: Any) -> Any:
    """May edit clusters and their catalogue, not their endpoint."""
    user = django_user_model.objects.create_user(username="edith", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="provisioning",
            codename__in=[
                *OPERATOR,
                "change_cluster",
                "change_machinetype",
                "add_machinetype",
                "change_template",
                "change_node",
            ],
        )
    )
    return user


def test_without_the_endpoint_permission_the_catalogue_is_editable_but_the_endpoint_is_not(
    sim: Sim, creds: Path, editor: Any, client: Any
) -> None:
    cluster = sim.cluster
    before = Cluster.objects.get(pk=cluster.pk)
    client.force_login(editor)
    data = _as_saved(cluster)
    data.update(
        {
            "url": "https://attacker.example:8006",
            "token_file": str(creds / "token"),
            "ca_file": str(creds / "ca.pem"),
            "insecure_skip_tls_verify": "on",
            "machine_types-0-cores": "4",
        }
    )
    page = client.get(f"{CLUSTERS}{cluster.pk}/change/").content.decode()
    assert 'name="url"' not in page and 'name="token_file"' not in page
    done = client.post(f"{CLUSTERS}{cluster.pk}/change/", data)
    assert done.status_code == 302, done.content.decode()[:2000]
    after = Cluster.objects.get(pk=cluster.pk)
    assert after.machine_types.get(key="small").cores == 4
    assert (after.url, after.token_file, after.ca_file, after.insecure_skip_tls_verify) == (
        before.url,
        before.token_file,
        before.ca_file,
        before.insecure_skip_tls_verify,
    )
    # Nor may such a user add a cluster (a new endpoint), or run the trust action.
    assert client.get(f"{CLUSTERS}add/").status_code == 403
    trust = client.post(CLUSTERS, {"action": "trust_ca", "_selected_action": [str(cluster.pk)]})
    assert trust.status_code == 403


def test_with_the_endpoint_permission_a_bad_path_is_refused_and_a_good_one_trusts_its_ca(
    sim: Sim, creds: Path, people: People
) -> None:
    cluster = sim.cluster
    client = people.client("superuser")
    url = f"{CLUSTERS}{cluster.pk}/change/"
    data = _as_saved(cluster)
    data.update({"token_file": "/etc/hostname", "ca_file": str(creds / "ca.pem")})
    refused = client.post(url, data)
    assert refused.status_code == 200
    text = refused.content.decode()
    assert "tokenFile must be an absolute path" in text and str(creds) in text
    assert Cluster.objects.get(pk=cluster.pk).token_file == cluster.token_file

    data["token_file"] = str(creds / "token")
    assert client.post(url, data).status_code == 302
    saved = Cluster.objects.get(pk=cluster.pk)
    ca_pem = load_ca(str(creds / "ca.pem"), root=str(creds))
    assert saved.ca_fingerprint == ca_fingerprint(ca_pem)
    page = client.get(url).content.decode()
    assert saved.ca_fingerprint in page
    assert ca_pem.splitlines()[1] not in page  # the fingerprint, never the CA

    # The node's CA is rotated; the action trusts the new one.
    (creds / "ca.pem").write_bytes(trustme.CA().cert_pem.bytes())
    client.post(CLUSTERS, {"action": "trust_ca", "_selected_action": [str(cluster.pk)]})
    rotated = ca_fingerprint(load_ca(str(creds / "ca.pem"), root=str(creds)))
    assert Cluster.objects.get(pk=cluster.pk).ca_fingerprint == rotated != saved.ca_fingerprint


def test_preflight_refuses_a_token_outside_the_directory_before_any_request(
    sim: Sim, creds: Path, people: People
) -> None:
    Cluster.objects.filter(pk=sim.cluster.pk).update(token_file="/etc/hostname")
    sim.engine.ledger.clear()
    page = people.client("operator").post(
        CLUSTERS, {"action": "preflight", "_selected_action": [str(sim.cluster.pk)]}
    )
    assert page.status_code == 200
    assert "tokenFile must be an absolute path" in page.content.decode()
    assert list(sim.engine.ledger.calls()) == []


def _proxies_file(tmp_path: Path, cloud_init_file: str) -> Path:
    path = tmp_path / "fleet" / "proxies.yaml"
    path.parent.mkdir(exist_ok=True)
    entries = [
        {"name": "good", "cluster": "pvesim", "machineType": "small", "image": "debian-13",
         "zone": "pve1", "cloudInitFile": "user-data.yaml"},
        {"name": "bad", "cluster": "pvesim", "machineType": "small", "image": "debian-13",
         "zone": "pve1", "cloudInitFile": cloud_init_file},
    ]  # fmt: skip
    (path.parent / "user-data.yaml").write_text("#cloud-config\n")
    path.write_text(yaml.safe_dump(entries))
    return path


def _cloud_init_fifo(d: Path) -> str:
    os.mkfifo(d / "fifo")
    return "fifo"


def _cloud_init_link(d: Path) -> str:
    (d / "link").symlink_to(d.parent / "outside.yaml")
    return "link"


def _cloud_init_big(d: Path) -> str:
    (d / "big.yaml").write_bytes(b"#" * (CLOUD_INIT_MAX_BYTES + 1))
    return "big.yaml"


CLOUD_INIT_BREAKS = {
    "absolute": (lambda d: str(d / "user-data.yaml"), "not an absolute path"),
    "dot-dot": (lambda d: "../outside.yaml", "inside the directory of the proxies file"),
    "symlink-out": (_cloud_init_link, "inside the directory of the proxies file"),
    "etc-hostname": (lambda d: "/etc/hostname", "not an absolute path"),
    "fifo": (_cloud_init_fifo, "is not a regular file"),
    "directory": (lambda d: ".", "is not a regular file"),
    "oversize": (_cloud_init_big, f"is larger than {CLOUD_INIT_MAX_BYTES} bytes"),
}


@pytest.mark.parametrize("case", sorted(CLOUD_INIT_BREAKS))
def test_proxies_file_reads_cloud_init_only_from_beside_it(
    sim: Sim, tmp_path: Path, case: str
) -> None:
    (tmp_path / "outside.yaml").write_text("#cloud-config\npassword: hunter2\n")
    (tmp_path / "fleet").mkdir()
    make, words = CLOUD_INIT_BREAKS[case]
    path = _proxies_file(tmp_path, make(tmp_path / "fleet"))
    with pytest.raises(CommandError) as refused:
        call_command("proxies", "create", "--file", str(path))
    message = str(refused.value)
    assert f"{path}[1].cloudInitFile (bad): " in message and words in message
    assert f"{path}[0]" not in message
    assert "hunter2" not in message
    assert not Proxy.objects.exists()
