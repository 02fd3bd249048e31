"""The proxy list at fleet scale: a page costs the same few queries at 100,000 proxies as at 10
(issue 12: at most 8 queries and 100 ms on PostgreSQL).

What Django's changelist costs by default over a big table, and what the proxy list does instead:

- The sidebar's node, machine type and image filters run a ``SELECT DISTINCT`` over the whole
  proxy table each: three sequential scans per page. Their choices come from the catalogue
  instead (the nodes, machine types and templates the clusters are configured with: a proxy is
  only ever placed on those), all three in one query; a value chosen by URL that the catalogue
  no longer lists is still offered, so the sidebar never hides the filter in force.
- The cluster filter's choices, the "unreachable" banner (circuit breakers) and the "no ready
  node" banner (health checks) each read the cluster table; one query per request loads the
  clusters with their breaker and health verdict, and all three read it.
- The paginator's ``COUNT(*)`` is a full scan of the table. Unfiltered, on PostgreSQL, with more
  than ``ESTIMATE_FROM`` rows, the planner's own row estimate (``pg_class.reltuples``, kept by
  ANALYZE and autovacuum) stands in for it, and the page says "about" (``pagination.html`` and
  ``actions.html`` under ``templates/admin/provisioning/proxy/``). A filtered or searched list
  is counted exactly: its count is what the operator asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db import connections
from django.db.models import CharField, Field, Model, QuerySet, Value
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from provisioning.models import CircuitBreaker, CircuitState, Cluster, MachineType, Node, Template

from . import health

if TYPE_CHECKING:  # the stubs' name for a lazy translation; Django itself has no such class
    from django.utils.functional import _StrPromise as StrPromise

# Below this many rows an exact count costs a few milliseconds and is what the page shows.
ESTIMATE_FROM = 50_000

# Where one request keeps what several parts of the page read (request attributes, as Django's
# own middleware keeps ``request.user``).
_CLUSTERS = "_proxyhub_changelist_clusters"
_CATALOGUE = "_proxyhub_changelist_catalogue"


@dataclass(frozen=True)
class ClusterBanners:
    """What the banners above the list say, from the request's one cluster query."""

    without_ready_node: list[Cluster]
    unreachable: list[CircuitBreaker]


def clusters(request: HttpRequest) -> list[Cluster]:
    """Every cluster with its breaker (``circuit``) and, when the ``healthchecks`` app is
    installed, its health verdict; one query per request, by name."""
    cached: list[Cluster] | None = getattr(request, _CLUSTERS, None)
    if cached is None:
        cached = list(
            Cluster.objects.select_related("circuit")
            .annotate(**health.cluster_health_annotations())
            .order_by("name")
        )
        setattr(request, _CLUSTERS, cached)
    return cached


def banners(request: HttpRequest) -> ClusterBanners:
    without_ready: list[Cluster] = []
    unreachable: list[CircuitBreaker] = []
    for cluster in clusters(request):
        if health.checked_without_ready_node(cluster):
            without_ready.append(cluster)
        breaker = _breaker(cluster)
        if breaker is not None and breaker.state != CircuitState.CLOSED:
            unreachable.append(breaker)
    return ClusterBanners(without_ready_node=without_ready, unreachable=unreachable)


def _breaker(cluster: Cluster) -> CircuitBreaker | None:
    try:
        return cluster.circuit
    except CircuitBreaker.DoesNotExist:  # a cluster that never failed has no breaker row
        return None


def catalogue_values(request: HttpRequest) -> dict[str, list[str]]:
    """The catalogue's node names, machine type keys and image keys over all clusters, sorted,
    keyed by the proxy field they fill; one query (a UNION) per request."""
    cached: dict[str, list[str]] | None = getattr(request, _CATALOGUE, None)
    if cached is None:

        def kind(name: str) -> Value:
            return Value(name, output_field=CharField())

        rows = (
            Node.objects.order_by()
            .values_list(kind("node"), "name")
            .union(
                MachineType.objects.order_by().values_list(kind("machine_type"), "key"),
                Template.objects.order_by().values_list(kind("image"), "key"),
            )
        )
        cached = {"node": [], "machine_type": [], "image": []}
        for field, value in rows:
            cached[field].append(value)
        for values in cached.values():
            values.sort()
        setattr(request, _CATALOGUE, cached)
    return cached


def action_checkbox(obj: Model) -> SafeString:
    """``ModelAdmin.action_checkbox``'s markup (a ``CheckboxInput`` with the same attributes),
    written with ``format_html`` instead of a template render per row."""
    return format_html(
        '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
        ACTION_CHECKBOX_NAME,
        str(obj.pk),
        format_html(gettext("Select this object for an action - {}"), str(obj)),
    )


class ClusterFilter(admin.RelatedFieldListFilter):
    """The cluster filter, its choices from the request's cluster list (no query of its own)."""

    def field_choices(
        self, field: Field, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> list[tuple[str, str | StrPromise]]:
        return [(str(cluster.pk), str(cluster)) for cluster in clusters(request)]


class CatalogueValuesFilter(admin.AllValuesFieldListFilter):
    """A filter on a proxy field the catalogue fills (node, machine type, image): its choices
    are the catalogue's values, not a ``SELECT DISTINCT`` over every proxy (see module doc)."""

    def __init__(
        self,
        field: Field,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin,
        field_path: str,
    ) -> None:
        # Django's __init__ builds a lazy DISTINCT queryset; it is replaced before anything runs it.
        super().__init__(field, request, params, model, model_admin, field_path)
        values = list(catalogue_values(request).get(field_path, []))
        for chosen in self.lookup_val or []:
            if chosen not in values:
                values.append(chosen)
        # A list where Django keeps a queryset: its uses (iteration, facet counts) take either.
        self.lookup_choices = values  # type: ignore[assignment]


class DriftFilter(admin.SimpleListFilter):
    """Proxies whose VM differs from its spec at the last comparison (issue 14), or not. Two
    fixed choices, so it costs no query of its own."""

    title = "drift"
    parameter_name = "drift"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("yes", "drifted"), ("no", "in step")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.exclude(drift=[])
        if self.value() == "no":
            return queryset.filter(drift=[])
        return queryset


class EstimatedCountPaginator(Paginator):
    """Django's paginator, with the planner's row estimate for the count of a big unfiltered
    table on PostgreSQL (see module doc). ``estimated`` tells the templates which they got.

    An estimate may be a little off either way, so a page past it is not refused: it shows the
    rows it finds (possibly none), as a list that grew since the estimate would.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        counted = _unfiltered_count(self.object_list)
        if counted is None:
            return super().count
        value, self.estimated = counted
        return value

    def validate_number(self, number: Any) -> int:
        if not self.count or not self.estimated:
            return super().validate_number(number)
        try:
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            number = int(number)
        except (TypeError, ValueError) as exc:
            raise PageNotAnInteger(self.error_messages["invalid_page"]) from exc
        if number < 1:
            raise EmptyPage(self.error_messages["min_page"])
        return number

    def page(self, number: Any) -> Page:
        if not self.estimated:
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)


# TABLE is replaced by the quoted table name (an identifier cannot be a query parameter).
_COUNT_OR_ESTIMATE = (
    "SELECT CASE WHEN reltuples >= %s THEN reltuples::bigint"
    " ELSE (SELECT COUNT(*) FROM TABLE) END, reltuples >= %s"
    " FROM pg_class WHERE oid = %s::regclass"
)


def _unfiltered_count(object_list: Any) -> tuple[int, bool] | None:
    """The row count of an unfiltered queryset's table on PostgreSQL and whether it is the
    planner's estimate, in one query: ``pg_class.reltuples`` when it is at least
    ``ESTIMATE_FROM``, else an exact ``COUNT(*)`` (an uncorrelated subquery, which PostgreSQL
    runs only when the CASE reaches it). A table never analysed has -1 there (0 before
    PostgreSQL 14) and is counted. None when this does not apply: the admin counts as usual."""
    if not isinstance(object_list, QuerySet) or object_list.query.where:
        return None
    if object_list.query.combinator or object_list.query.distinct:
        return None
    connection = connections[object_list.db]
    if connection.vendor != "postgresql":
        return None
    table = connection.ops.quote_name(object_list.model._meta.db_table)
    sql = _COUNT_OR_ESTIMATE.replace("TABLE", table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [ESTIMATE_FROM, ESTIMATE_FROM, table])
        row = cursor.fetchone()
    if row is None:
        return None
    return int(row[0]), bool(row[1])
