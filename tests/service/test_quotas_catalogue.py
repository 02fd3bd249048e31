"""A cluster's quotas in the catalogue (``quotas: {maxProxies, maxConcurrentCreates}``) and the
cluster admin: they import, export and import back unchanged, and a bad value is refused with
its path and nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_admin_clusters import CLUSTERS, _cluster_form
from test_admin_support import People, people_fixture  # noqa: F401
from test_catalogue import _doc, _import_file, _snapshot, _write

from provisioning.models import Cluster
from provisioning.services.catalogue import CatalogueError, catalogue_load
from provisioning.services.catalogue_export import catalogue_export
from provisioning.services.catalogue_import import catalogue_import

pytestmark = pytest.mark.django_db


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text("proxyhub@pve!cat=00000000-0000-0000-0000-000000000000\n")
    return str(path)


def test_quotas_import_export_and_import_back_unchanged(tmp_path: Path, token_file: str) -> None:
    quotas = {"maxProxies": 50, "maxConcurrentCreates": 5}
    report = _import_file(tmp_path, _doc(token_file, quotas=quotas))
    assert report.created == ["proxmox-home"]
    cluster = Cluster.objects.get()
    assert (cluster.max_proxies, cluster.max_concurrent_creates) == (50, 5)
    exported = catalogue_export()
    assert yaml.safe_load(exported)["quotas"] == quotas
    path = tmp_path / "exported.yaml"
    path.write_text(exported)
    again = catalogue_import(catalogue_load([str(path)]))
    assert again.unchanged == ["proxmox-home"]


def test_an_unlimited_cluster_exports_no_quotas_key(tmp_path: Path, token_file: str) -> None:
    _import_file(tmp_path, _doc(token_file))
    assert "quotas" not in yaml.safe_load(catalogue_export())


def test_changing_or_dropping_quotas_updates_the_cluster_and_says_so(
    tmp_path: Path, token_file: str
) -> None:
    _import_file(tmp_path, _doc(token_file, quotas={"maxProxies": 50}))
    changed = _import_file(tmp_path, _doc(token_file, quotas={"maxProxies": 60}), dry_run=True)
    assert changed.clusters[0].summary(dry_run=True) == (
        "would update cluster proxmox-home: quotas.maxProxies"
    )
    assert Cluster.objects.get().max_proxies == 50  # a dry run writes nothing
    # The document describes the whole cluster: without quotas, the cluster is unlimited.
    dropped = _import_file(tmp_path, _doc(token_file))
    assert dropped.updated == ["proxmox-home"]
    assert Cluster.objects.get().max_proxies is None


@pytest.mark.parametrize(
    ("quotas", "path", "fragment"),
    [
        ({"maxProxies": -1}, "quotas.maxProxies", "from 0 to 1000000, or null for unlimited"),
        ({"maxProxies": "ten"}, "quotas.maxProxies", "got text"),
        ({"maxConcurrentCreates": True}, "quotas.maxConcurrentCreates", "got True"),
        ({"maxConcurrentCreates": 2.5}, "quotas.maxConcurrentCreates", "got 2.5"),
        ({"maxProxies": 1_000_001}, "quotas.maxProxies", "got 1000001"),
        ({"maxVMs": 3}, "quotas.maxVMs", "allowed: maxProxies, maxConcurrentCreates"),
        (5, "quotas", "must be a map with the keys maxProxies, maxConcurrentCreates"),
    ],
)
def test_bad_quotas_are_refused_with_their_path_and_nothing_is_written(
    tmp_path: Path, token_file: str, quotas: Any, path: str, fragment: str
) -> None:
    _import_file(tmp_path, _doc(token_file, name="existing"))
    before = _snapshot()
    with pytest.raises(CatalogueError) as caught:
        _import_file(tmp_path, _doc(token_file, quotas=quotas), _doc(token_file, name="existing"))
    problems = {p.path: p.message for p in caught.value.problems}
    where = f"{tmp_path / 'catalogue.yaml'}[0].{path}"
    assert fragment in problems[where]
    assert _snapshot() == before


def test_an_unknown_top_level_key_lists_quotas_among_the_allowed(
    tmp_path: Path, token_file: str
) -> None:
    with pytest.raises(CatalogueError) as caught:
        catalogue_import(catalogue_load([_write(tmp_path, _doc(token_file, quota=1))]))
    (problem,) = caught.value.problems
    assert problem.path.endswith("[0].quota")
    assert problem.message.startswith("is not a known key; allowed: ")
    assert problem.message.endswith(", quotas")


def test_the_cluster_admin_edits_the_quotas(people: People) -> None:
    client = people.client("superuser")
    page = client.get(f"{CLUSTERS}add/").content.decode()
    assert "Max proxies (maxProxies)" in page and "Max concurrent creates" in page
    done = client.post(
        f"{CLUSTERS}add/", _cluster_form(max_proxies="50", max_concurrent_creates="")
    )
    assert done.status_code == 302
    cluster = Cluster.objects.get()
    assert (cluster.max_proxies, cluster.max_concurrent_creates) == (50, None)
    refused = client.post(
        f"{CLUSTERS}add/", _cluster_form(name="other", max_proxies="-1", max_concurrent_creates="")
    )
    assert "greater than or equal to 0" in refused.content.decode()
    assert Cluster.objects.count() == 1
