"""Migration 0010_sealing on rows written before it: vendor-data sealed, plain cloud-init
digests replaced by keyed ones, and no proxy made to look edited."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from provisioning import sealing

BEFORE = [("provisioning", "0009_journal_retention")]
AFTER = [("provisioning", "0010_sealing")]
USER_DATA = b"#cloud-config\nchpasswd: {list: 'root:migration-canary-41d2'}\n"
VENDOR = "#cloud-config\nruncmd: [[echo, vendor-migration-canary-8e0f]]\n"


def _spec_hash(cluster_id: int, digest: str) -> str:
    parts = [str(cluster_id), "pve1", "small", "debian-13", digest]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


@pytest.fixture
def executor(transactional_db: None) -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    executor.loader.build_graph()
    yield executor
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_existing_rows_are_sealed_and_rekeyed(executor: MigrationExecutor, settings: Any) -> None:
    settings.PROXYHUB_SEALING_KEYS = []  # sealed by the old release: the key from SECRET_KEY
    apps = executor.loader.project_state(BEFORE).apps
    cluster = apps.get_model("provisioning", "Cluster").objects.create(
        name="old", url="https://pve:8006", token_file="/t", iso_storage="local", vendor_data=VENDOR
    )
    plain = hashlib.sha256(USER_DATA).hexdigest()
    proxy_model = apps.get_model("provisioning", "Proxy")
    common = {"cluster": cluster, "zone": "pve1", "machine_type": "small", "image": "debian-13"}
    proxy_model.objects.create(
        name="built",
        cloud_init_sealed=sealing.seal(USER_DATA),
        cloud_init_sha256=plain,
        cloud_init_bytes=len(USER_DATA),
        spec_hash=_spec_hash(cluster.pk, plain),
        **common,
    )
    proxy_model.objects.create(
        name="edited",
        cloud_init_sealed=sealing.seal(USER_DATA),
        cloud_init_sha256=plain,
        cloud_init_bytes=len(USER_DATA),
        spec_hash="0" * 64,
        **common,
    )
    settings.PROXYHUB_SEALING_KEYS = ["bmV3LXNlYWxpbmcta2V5LWZvci10aGUtdGVzdHMtMDE="]

    executor.loader.build_graph()
    executor.migrate(AFTER)

    apps = executor.loader.project_state(AFTER).apps
    row = apps.get_model("provisioning", "Cluster").objects.get(name="old")
    assert b"vendor-migration-canary" not in bytes(row.vendor_data_sealed)
    assert sealing.unseal(bytes(row.vendor_data_sealed)).decode() == VENDOR
    proxies = {p.name: p for p in apps.get_model("provisioning", "Proxy").objects.all()}
    keyed = sealing.digest(USER_DATA)
    assert {p.cloud_init_sha256 for p in proxies.values()} == {keyed}
    assert proxies["built"].spec_hash == _spec_hash(cluster.pk, keyed)  # still current
    assert proxies["edited"].spec_hash == "0" * 64  # still different
