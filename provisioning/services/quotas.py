"""Quotas: per-cluster limits on proxies and on creates in flight, and a per-user bulk limit.

A declaration that would pass a limit is refused whole, before anything is written, with a
message naming the limit, the cluster or user, what is held now and what the request adds.

- ``maxProxies`` counts the cluster's live proxies: rows whose desired state is ``present``.
  A proxy being deleted no longer counts (its delete is final; a retry of it deletes again), so
  deleting proxies makes room at once even while their VMs are still going away.
- ``maxConcurrentCreates`` counts the cluster's create and replace operations in the journal
  that have not finished (queued, running, waiting or unknown): the journal is the source of
  truth for progress. A replace builds a new VM exactly as a create does (clone, seed ISO,
  boot), so it counts and is refused at the limit too; a proxy's own unfinished create or
  replace, which a replace supersedes in the same transaction, is not counted against it.
- The bulk limit caps how many proxies one request of ``proxies_create`` declares:
  ``PROXYHUB_MAX_BULK_CREATE``, or the console user's own ``UserQuota``. Commands run as an
  operating-system user, who has no ``UserQuota``: they get the setting, which an operator can
  raise for one run (``PROXYHUB_MAX_BULK_CREATE=500 manage.py proxies create ...``).

Reconcile's own creates and replaces (a VM that vanished) are not declarations and are never
refused: the proxy was admitted when it was declared.

The admitting checks run inside the declaring transaction, after taking the cluster row's lock
(``SELECT ... FOR NO KEY UPDATE`` on PostgreSQL, which leaves foreign-key inserts of other
transactions alone), so two declarations on one cluster are counted one after the other and
cannot both pass a limit only one fits in. SQLite has one writer at a time anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import connection

from provisioning.models import Cluster, Operation, Proxy, UserQuota
from provisioning.models.catalogue import QUOTA_MAX
from provisioning.models.choices import ACTIVE_STATES, DesiredState, OperationKind
from provisioning.proxmox.config import FieldError

User = AbstractBaseUser | AnonymousUser | None

BULK_SETTING = "PROXYHUB_MAX_BULK_CREATE"
BULK_DEFAULT = 100
_BUILDS = (OperationKind.CREATE, OperationKind.REPLACE)


class QuotaExceeded(ValidationError):
    """A declaration refused by a quota; the message names the limit. A ``ValidationError``, so
    every door that reports a refused declaration reports this one the same way."""


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


# --- per user: bulk creates -------------------------------------------------------------------


def bulk_limit_for(*, user: User) -> tuple[int, str]:
    """How many proxies ``user`` may declare in one bulk create, and where that limit comes
    from (for messages): their ``UserQuota``, else ``PROXYHUB_MAX_BULK_CREATE``."""
    if user is not None and user.is_authenticated:
        own = UserQuota.objects.filter(user_id=user.pk).values_list("max_bulk_create", flat=True)
        for limit in own:
            return limit, "their user quota"
    return int(getattr(settings, BULK_SETTING, BULK_DEFAULT)), BULK_SETTING


def bulk_create_admit(*, user: User, count: int) -> None:
    """Refuse a bulk create of ``count`` proxies that is over the requester's limit."""
    limit, source = bulk_limit_for(user=user)
    if count <= limit:
        return
    who = (
        f"user {user.get_username()}" if user is not None and user.is_authenticated else "a command"
    )
    raise QuotaExceeded(
        f"{who} may declare at most {limit} {_plural(limit, 'proxy', 'proxies')} in one bulk "
        f"create ({source}); this request declares {count}",
        code="quota",
    )


# --- per cluster: proxies and creates in flight -----------------------------------------------


def cluster_quota_problems(
    *, cluster: Cluster, proxies: int, creates: int, superseding: Proxy | None = None
) -> list[str]:
    """What adding ``proxies`` live proxies and ``creates`` creates in flight to ``cluster``
    would exceed, as messages; empty when it fits. Reads ``cluster``'s limits as given: a caller
    that must be exact passes the row it locked (``cluster_quota_admit``); the admin's early
    checks pass the row they read, and the service checks again when it writes."""
    problems: list[str] = []
    if cluster.max_proxies is not None and proxies > 0:
        live = Proxy.objects.filter(cluster=cluster, desired_state=DesiredState.PRESENT).count()
        if live + proxies > cluster.max_proxies:
            problems.append(
                f"cluster {cluster.name} allows at most {cluster.max_proxies} "
                f"{_plural(cluster.max_proxies, 'proxy', 'proxies')} (maxProxies); it holds "
                f"{live} and this request adds {proxies}"
            )
    if cluster.max_concurrent_creates is not None and creates > 0:
        building = Operation.objects.filter(
            cluster=cluster, kind__in=_BUILDS, state__in=ACTIVE_STATES
        )
        if superseding is not None:
            building = building.exclude(proxy=superseding)
        in_flight = building.count()
        if in_flight + creates > cluster.max_concurrent_creates:
            problems.append(
                f"cluster {cluster.name} allows at most {cluster.max_concurrent_creates} "
                f"{_plural(cluster.max_concurrent_creates, 'create', 'creates')} in flight "
                f"(maxConcurrentCreates); {in_flight} "
                f"{_plural(in_flight, 'is', 'are')} in flight and this request adds {creates}; "
                "ask again when some have reached Running or Failed"
            )
    return problems


def cluster_lock(*, cluster_ids: Iterable[int]) -> dict[int, Cluster]:
    """Lock the clusters' rows for the rest of the transaction and read their current limits.

    Locks are taken in primary-key order, so two declarations spanning the same clusters never
    wait on each other in a cycle. Callers lock the cluster before any proxy row of it."""
    no_key = connection.features.has_select_for_no_key_update
    rows = (
        Cluster.objects.select_for_update(no_key=no_key)
        .filter(pk__in=sorted(set(cluster_ids)))
        .order_by("pk")
        .only("pk", "name", "max_proxies", "max_concurrent_creates")
    )
    return {row.pk: row for row in rows}


def cluster_quota_admit(
    *,
    cluster: Cluster,
    proxies: int,
    creates: int,
    superseding: Proxy | None = None,
) -> None:
    """Inside the declaring transaction: lock the cluster and refuse the declaration if it
    would exceed a limit (``QuotaExceeded`` naming every limit it exceeds)."""
    locked = cluster_lock(cluster_ids=[cluster.pk])[cluster.pk]
    problems = cluster_quota_problems(
        cluster=locked, proxies=proxies, creates=creates, superseding=superseding
    )
    if problems:
        raise QuotaExceeded("; ".join(problems), code="quota")


def clusters_quota_admit(*, adding: Mapping[int, int]) -> None:
    """``cluster_quota_admit`` for a declaration of new proxies over several clusters (a
    ``--file`` may name several): ``adding`` maps a cluster's id to how many new proxies, each
    with its create, it receives. Every cluster is locked first, then every limit checked."""
    locked = cluster_lock(cluster_ids=adding)
    problems = [
        problem
        for pk in sorted(adding)
        for problem in cluster_quota_problems(
            cluster=locked[pk], proxies=adding[pk], creates=adding[pk]
        )
    ]
    if problems:
        raise QuotaExceeded("; ".join(problems), code="quota")


# --- in the catalogue -------------------------------------------------------------------------

CATALOGUE_KEY = "quotas"
# Catalogue key → Cluster field.
_CATALOGUE_FIELDS = {"maxProxies": "max_proxies", "maxConcurrentCreates": "max_concurrent_creates"}


@dataclass(frozen=True)
class ClusterQuotas:
    """A cluster's limits as the catalogue's ``quotas:`` map holds them; None is unlimited."""

    max_proxies: int | None = None
    max_concurrent_creates: int | None = None

    def to_mapping(self) -> dict[str, int]:
        """The ``quotas:`` map of an export: only the limits that are set."""
        return {
            key: getattr(self, field)
            for key, field in _CATALOGUE_FIELDS.items()
            if getattr(self, field) is not None
        }

    def changed_keys(self, cluster: Cluster) -> list[str]:
        """The ``quotas.*`` paths whose value differs from ``cluster``'s."""
        return [
            f"{CATALOGUE_KEY}.{key}"
            for key, field in _CATALOGUE_FIELDS.items()
            if getattr(self, field) != getattr(cluster, field)
        ]

    def apply(self, cluster: Cluster) -> None:
        for field in _CATALOGUE_FIELDS.values():
            setattr(cluster, field, getattr(self, field))


def cluster_quotas_of(cluster: Cluster) -> ClusterQuotas:
    return ClusterQuotas(
        max_proxies=cluster.max_proxies, max_concurrent_creates=cluster.max_concurrent_creates
    )


def cluster_quotas_parse(raw: Any, *, path: str) -> tuple[ClusterQuotas, list[FieldError]]:
    """A document's ``quotas:`` value (``path`` is where it is, like ``FILE[0].quotas``):
    a map of ``maxProxies`` and ``maxConcurrentCreates``, each a whole number from 0 to
    ``QUOTA_MAX`` or null (unlimited). Absent (``raw`` None) means no limits. Unknown keys are
    refused, like every other key of the catalogue."""
    if raw is None:
        return ClusterQuotas(), []
    if not isinstance(raw, Mapping):
        allowed = ", ".join(_CATALOGUE_FIELDS)
        return ClusterQuotas(), [FieldError(path, f"must be a map with the keys {allowed}")]
    problems = [
        FieldError(f"{path}.{key}", f"is not a known key; allowed: {', '.join(_CATALOGUE_FIELDS)}")
        for key in raw
        if key not in _CATALOGUE_FIELDS
    ]
    values: dict[str, int | None] = {}
    for key, field in _CATALOGUE_FIELDS.items():
        value = raw.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= QUOTA_MAX
        ):
            shown = (
                repr(value)
                if isinstance(value, int | float)
                else ("text" if isinstance(value, str) else type(value).__name__)
            )
            problems.append(
                FieldError(
                    f"{path}.{key}",
                    f"must be a whole number from 0 to {QUOTA_MAX}, or null for unlimited; "
                    f"got {shown}",
                )
            )
            value = None
        values[field] = value
    return ClusterQuotas(**values), problems
