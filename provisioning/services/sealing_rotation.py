"""Re-sealing every sealed column under the newest key (``manage.py rotate_sealing_key``).

A rotation puts a new key in front of ``PROXYHUB_SEALING_KEYS``; rows sealed under the older
keys stay readable, and this service re-seals them so the old keys can be dropped. Proxies'
cloud-init and clusters' vendor-data are the sealed columns.

The keyed digest of a cloud-init changes with the key, and so would ``Proxy.spec_hash``,
which records what the VM was built from. Neither may make the control loop see an edit: the
digest is recomputed in the same row update as the seal, and the stored ``spec_hash`` is moved
to the new digest only when it matched the old one (a proxy edited since its VM was built keeps
its difference, a proxy not edited keeps its equality). Nothing else of the row changes: not
``updated_at``, not ``generation``, no operation is started.

Rows are taken in primary-key batches, each batch in its own transaction with its rows locked,
so a large fleet never holds one long transaction and an edit racing the rotation waits for
its batch. Running it twice is harmless: a row already sealed under the newest key, whose
digest is current, is counted as current and left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from provisioning import sealing
from provisioning.models import Cluster, Proxy
from provisioning.models.proxy import spec_hash_of

# Rows per transaction: small enough that a batch's locks are short.
BATCH_SIZE = 200


@dataclass
class RotationCounts:
    """What happened to one sealed column."""

    resealed: int = 0
    current: int = 0
    empty: int = 0
    unreadable: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "resealed": self.resealed,
            "current": self.current,
            "empty": self.empty,
            "unreadable": len(self.unreadable),
            "unreadableNames": sorted(self.unreadable),
        }


@dataclass
class RotationReport:
    """The outcome of ``sealing_key_rotate``: per column, and whether anything is unreadable."""

    cloud_init: RotationCounts = field(default_factory=RotationCounts)
    vendor_data: RotationCounts = field(default_factory=RotationCounts)

    @property
    def ok(self) -> bool:
        return not (self.cloud_init.unreadable or self.vendor_data.unreadable)

    def as_dict(self) -> dict[str, Any]:
        return {"cloudInit": self.cloud_init.as_dict(), "vendorData": self.vendor_data.as_dict()}


def sealing_key_rotate(*, batch_size: int = BATCH_SIZE) -> RotationReport:
    """Re-seal every proxy's cloud-init and every cluster's vendor-data under the newest key.

    A row no configured key opens is named in the report and left as it is (the caller exits
    non-zero); every other row is re-sealed.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    report = RotationReport()
    _in_batches(Proxy, batch_size, lambda proxy: _reseal_proxy(proxy, report.cloud_init))
    _in_batches(Cluster, batch_size, lambda cluster: _reseal_cluster(cluster, report.vendor_data))
    return report


def _in_batches(
    model: type[Proxy] | type[Cluster], batch_size: int, reseal: Callable[[Any], None]
) -> None:
    """Call ``reseal`` on every row of ``model``, one locked primary-key batch per transaction."""
    last = 0
    while True:
        with transaction.atomic():
            rows = list(
                model.objects.select_for_update().filter(pk__gt=last).order_by("pk")[:batch_size]
            )
            for row in rows:
                reseal(row)
        if len(rows) < batch_size:
            return
        last = rows[-1].pk


def _reseal_proxy(proxy: Proxy, counts: RotationCounts) -> None:
    token = bytes(proxy.cloud_init_sealed)
    if not token:
        counts.empty += 1
        return
    try:
        data = sealing.unseal(token)
    except sealing.SealError:
        counts.unreadable.append(proxy.name)
        return
    new_digest = sealing.digest(data)
    if sealing.is_current(token) and proxy.cloud_init_sha256 == new_digest:
        counts.current += 1
        return
    built_from_current = proxy.spec_hash == proxy.compute_spec_hash()
    proxy.cloud_init_sealed = sealing.seal(data)
    proxy.cloud_init_sha256 = new_digest
    fields = ["cloud_init_sealed", "cloud_init_sha256"]
    if proxy.spec_hash and built_from_current:
        proxy.spec_hash = spec_hash_of(
            proxy.cluster_id, proxy.zone, proxy.machine_type, proxy.image, new_digest
        )
        fields.append("spec_hash")
    # update_fields without updated_at: re-sealing is not an edit an operator made.
    proxy.save(update_fields=fields)
    counts.resealed += 1


def _reseal_cluster(cluster: Cluster, counts: RotationCounts) -> None:
    token = bytes(cluster.vendor_data_sealed)
    if not token:
        counts.empty += 1
        return
    try:
        text = cluster.vendor_data
    except sealing.SealError:
        counts.unreadable.append(cluster.name)
        return
    if sealing.is_current(token):
        counts.current += 1
        return
    cluster.vendor_data = text
    # Not updated_at: the provider cache keys on it, and the content is the same.
    cluster.save(update_fields=["vendor_data_sealed"])
    counts.resealed += 1
