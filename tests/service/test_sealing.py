"""Keys and sealed data (issue 11): a dedicated, rotatable sealing key, sealed vendor-data, keyed
digests. Rotation keeps every row readable, moves it under the newest key, and never makes the
control loop see an edit."""

from __future__ import annotations

import hashlib
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from pump import Pump, Sim, proxy_spec

from provisioning import sealing
from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import Phase
from provisioning.services import operations
from provisioning.services.operations import IdempotencyConflict
from provisioning.services.reconcile import reconcile_round
from provisioning.services.sealing_rotation import sealing_key_rotate

pytestmark = pytest.mark.django_db

OLD = "b2xkLXNlYWxpbmcta2V5LWZvci10aGUtdGVzdHMtMDE="  # b"old-sealing-key-for-the-tests-01"
NEW = "bmV3LXNlYWxpbmcta2V5LWZvci10aGUtdGVzdHMtMDE="  # b"new-sealing-key-for-the-tests-01"
CANARY = b"sealing-canary-7f3b91"
USER_DATA = b"#cloud-config\nchpasswd: {list: 'root:" + CANARY + b"'}\n"
VENDOR_CANARY = "vendor-sealing-canary-2c8e44"
VENDOR = f"#cloud-config\nwrite_files:\n  - content: {VENDOR_CANARY}\n"


def _proxies(sim: Sim, count: int, settings: Any, *, keys: list[str]) -> list[Proxy]:
    settings.PROXYHUB_SEALING_KEYS = keys
    for i in range(count):
        operations.proxy_create(spec=proxy_spec(sim, f"s{i}", cloud_init=USER_DATA))
    return list(Proxy.objects.order_by("name"))


def _row_bytes(table: str) -> list[bytes]:
    """Every column value of every row of ``table``, as the database returns it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608
        rows = cursor.fetchall()
    out = []
    for row in rows:
        for value in row:
            if isinstance(value, memoryview):
                value = value.tobytes()
            out.append(value if isinstance(value, bytes) else str(value).encode())
    return out


def test_rotation_reseals_every_row_so_the_old_key_can_go(sim: Sim, settings: Any) -> None:
    proxies = _proxies(sim, 3, settings, keys=[OLD])
    sim.cluster.vendor_data = VENDOR
    sim.cluster.save()
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    # Before the rotation the old rows open through the old key, behind the new one.
    assert all(p.cloud_init == USER_DATA for p in Proxy.objects.all())

    report = sealing_key_rotate(batch_size=2)  # two batches for three proxies

    assert report.ok
    assert report.cloud_init.resealed == 3 and report.vendor_data.resealed == 1
    settings.PROXYHUB_SEALING_KEYS = [NEW]
    assert [p.cloud_init for p in Proxy.objects.order_by("name")] == [USER_DATA] * 3
    assert Cluster.objects.get(pk=sim.cluster.pk).vendor_data == VENDOR
    assert all(p.cloud_init_sha256 == sealing.digest(USER_DATA) for p in Proxy.objects.all())
    assert [p.pk for p in proxies] == list(
        Proxy.objects.order_by("name").values_list("pk", flat=True)
    )


def test_rotation_twice_changes_nothing_the_second_time(sim: Sim, settings: Any) -> None:
    _proxies(sim, 2, settings, keys=[OLD])
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    sealing_key_rotate()
    sealed = list(Proxy.objects.order_by("name").values_list("cloud_init_sealed", flat=True))

    again = sealing_key_rotate()

    assert (again.cloud_init.resealed, again.cloud_init.current) == (0, 2)
    after = list(Proxy.objects.order_by("name").values_list("cloud_init_sealed", flat=True))
    assert [bytes(s) for s in after] == [bytes(s) for s in sealed]


def test_rotation_causes_no_replace_and_no_operation(pump: Pump, sim: Sim, settings: Any) -> None:
    """The digest moves with the key, and with it the spec hash; the control loop must still
    see the proxy as built from its current spec: reconcile starts nothing, the simulator sees
    no mutation, and saving the same cloud-init again is no edit."""
    settings.PROXYHUB_SEALING_KEYS = [OLD]
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "steady", cloud_init=USER_DATA))
    pump.run()
    proxy = Proxy.objects.get()
    assert proxy.phase == Phase.RUNNING and proxy.spec_hash == proxy.compute_spec_hash()
    before = Proxy.objects.values(
        "spec_hash", "generation", "updated_at", "cloud_init_sha256"
    ).get()
    operations_before = Operation.objects.count()
    mutations_before = sim.ledger_mutations()

    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    call_command("rotate_sealing_key", stdout=StringIO())
    pump.call(reconcile_round)
    pump.run()

    proxy = Proxy.objects.get()
    after = Proxy.objects.values("spec_hash", "generation", "updated_at", "cloud_init_sha256").get()
    assert after["cloud_init_sha256"] != before["cloud_init_sha256"]  # the digest did move
    assert proxy.spec_hash == proxy.compute_spec_hash()
    assert (after["generation"], after["updated_at"]) == (
        before["generation"],
        before["updated_at"],
    )
    assert Operation.objects.count() == operations_before
    assert sim.ledger_mutations() == mutations_before
    assert operations.proxy_update(proxy=proxy, cloud_init=USER_DATA) is None
    assert Operation.objects.count() == operations_before


def test_rotation_keeps_an_edited_proxy_edited(sim: Sim, settings: Any) -> None:
    """A proxy whose VM was built from another spec keeps its difference through a rotation."""
    (proxy,) = _proxies(sim, 1, settings, keys=[OLD])
    Proxy.objects.filter(pk=proxy.pk).update(spec_hash="0" * 64)
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]

    sealing_key_rotate()

    proxy.refresh_from_db()
    assert proxy.spec_hash == "0" * 64 != proxy.compute_spec_hash()


def test_an_unreadable_row_is_named_and_the_rest_are_resealed(sim: Sim, settings: Any) -> None:
    _proxies(sim, 2, settings, keys=[OLD])
    Proxy.objects.filter(name="s0").update(cloud_init_sealed=b"sealed-with-a-lost-key")
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]

    with pytest.raises(CommandError, match=r"1 row\(s\) open with no key .*: s0;"):
        call_command("rotate_sealing_key", stdout=StringIO())

    settings.PROXYHUB_SEALING_KEYS = [NEW]
    assert Proxy.objects.get(name="s1").cloud_init == USER_DATA
    assert bytes(Proxy.objects.get(name="s0").cloud_init_sealed) == b"sealed-with-a-lost-key"


def test_rotate_reports_counts_as_json(sim: Sim, settings: Any) -> None:
    _proxies(sim, 2, settings, keys=[OLD])
    Proxy.objects.create(name="bare", cluster=sim.cluster, machine_type="small", image="debian-13")
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    out = StringIO()

    call_command("rotate_sealing_key", "--json", stdout=out)

    counts = json.loads(out.getvalue())
    assert counts["cloudInit"] == {
        "resealed": 2,
        "current": 0,
        "empty": 1,
        "unreadable": 0,
        "unreadableNames": [],
    }
    assert counts["vendorData"]["empty"] == 1


def test_changing_secret_key_leaves_sealed_rows_readable(sim: Sim, settings: Any) -> None:
    _proxies(sim, 1, settings, keys=[NEW])
    sim.cluster.vendor_data = VENDOR
    sim.cluster.save()

    settings.SECRET_KEY = "a-completely-different-django-secret-key-after-rotation-0123456789"

    assert Proxy.objects.get().cloud_init == USER_DATA
    assert Cluster.objects.get(pk=sim.cluster.pk).vendor_data == VENDOR


def test_rows_sealed_before_the_setting_open_until_rotated(sim: Sim, settings: Any) -> None:
    """An upgraded install: rows sealed under the key derived from SECRET_KEY still open once
    PROXYHUB_SEALING_KEYS is set, and after the rotation SECRET_KEY no longer matters."""
    _proxies(sim, 2, settings, keys=[])  # no sealing key: the legacy derived key seals
    settings.PROXYHUB_SEALING_KEYS = [NEW]
    assert all(p.cloud_init == USER_DATA for p in Proxy.objects.all())

    assert sealing_key_rotate().cloud_init.resealed == 2

    settings.SECRET_KEY = "the-django-secret-key-rotated-after-the-upgrade-0123456789abcdef"
    assert all(p.cloud_init == USER_DATA for p in Proxy.objects.all())


def test_no_sealed_value_is_in_any_column_in_clear(sim: Sim, settings: Any) -> None:
    _proxies(sim, 1, settings, keys=[NEW])
    sim.cluster.vendor_data = VENDOR
    sim.cluster.save()

    for table in (Proxy._meta.db_table, Cluster._meta.db_table, Operation._meta.db_table):
        for value in _row_bytes(table):
            assert CANARY not in value, table
            assert VENDOR_CANARY.encode() not in value, table
            assert hashlib.sha256(USER_DATA).hexdigest().encode() not in value, table


def test_the_digest_is_keyed(settings: Any) -> None:
    settings.PROXYHUB_SEALING_KEYS = [OLD]
    under_old = sealing.digest(USER_DATA)
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    under_new = sealing.digest(USER_DATA)

    assert under_old != hashlib.sha256(USER_DATA).hexdigest()
    assert len(under_old) == 64 and under_new != under_old
    assert sealing.digests(USER_DATA)[:2] == [under_new, under_old]


def test_a_repeated_create_still_matches_after_a_new_key(sim: Sim, settings: Any) -> None:
    """The idempotency check compares keyed digests: the same request made again after a new key
    was put in front returns the first operation, and a different cloud-init is a conflict."""
    settings.PROXYHUB_SEALING_KEYS = [OLD]
    first = operations.proxy_create(
        spec=proxy_spec(sim, "idem", cloud_init=USER_DATA), idempotency_key="k-1"
    )
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]

    again = operations.proxy_create(
        spec=proxy_spec(sim, "idem", cloud_init=USER_DATA), idempotency_key="k-1"
    )

    assert again.pk == first.pk
    with pytest.raises(IdempotencyConflict):
        operations.proxy_create(
            spec=proxy_spec(sim, "idem", cloud_init=b"#cloud-config\n"), idempotency_key="k-1"
        )


def test_a_browser_token_sealed_before_a_new_key_is_refused_naming_why(settings: Any) -> None:
    # sealed_tokens seals for one purpose under a key derived from the newest sealing key: a
    # new key in front means the page's token no longer opens, and the confirm says why.
    from provisioning import sealed_tokens

    settings.PROXYHUB_SEALING_KEYS = [OLD]
    token = sealed_tokens.token_dumps(USER_DATA, purpose="bulk", user_id=7)
    sealed_under_old = sealing.seal(USER_DATA)
    assert sealed_tokens.token_loads(token, purpose="bulk", user_id=7, max_age=60) == USER_DATA
    settings.PROXYHUB_SEALING_KEYS = [NEW, OLD]
    with pytest.raises(sealed_tokens.TokenInvalid, match="a key this server no longer has"):
        sealed_tokens.token_loads(token, purpose="bulk", user_id=7, max_age=60)
    # At rest, the old key still opens what it sealed; only the newest key's seals are current.
    assert sealing.unseal(sealed_under_old) == USER_DATA
    assert not sealing.is_current(sealed_under_old)
    assert sealing.is_current(sealing.seal(USER_DATA))
