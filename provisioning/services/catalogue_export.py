"""Exporting the catalogue: one YAML document per cluster, in the form the import reads."""

from __future__ import annotations

from collections.abc import Iterable

import yaml

from provisioning.models import Cluster
from provisioning.proxmox.config import FieldError

from .catalogue import (
    API_VERSION,
    KIND,
    PLACEHOLDER_INSTALLATION,
    VENDOR_DATA_PLACEHOLDER,
    CatalogueError,
)
from .quotas import CATALOGUE_KEY, cluster_quotas_of


class _Dumper(yaml.SafeDumper):
    """Multi-line text (vendor-data) as a literal block, so an export reads like the input."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def _quotas(cluster: Cluster) -> dict[str, dict[str, int]]:
    """The ``quotas:`` map, only when the cluster has a limit (an unlimited cluster's document
    reads as it did before quotas existed)."""
    limits = cluster_quotas_of(cluster).to_mapping()
    return {CATALOGUE_KEY: limits} if limits else {}


def catalogue_export(
    clusters: Iterable[str] | None = None, *, include_secrets: bool = False
) -> str:
    """The catalogue as YAML documents, one per cluster in name order; importing the output
    changes nothing. ``clusters`` names the clusters to export (default: all).

    Vendor-data is written as ``VENDOR_DATA_PLACEHOLDER`` unless ``include_secrets``: it is
    sealed at rest because it may carry secrets, and an export is a file that travels.
    """
    rows = Cluster.objects.order_by("name")
    if clusters is not None:
        wanted = list(dict.fromkeys(clusters))
        rows = rows.filter(name__in=wanted)
        missing = sorted(set(wanted) - {c.name for c in rows})
        if missing:
            raise CatalogueError(
                [FieldError("cluster", f"no cluster is named {name}") for name in missing],
                headline="nothing was exported",
            )
    documents = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            **_mapping(c, include_secrets=include_secrets),
            **_quotas(c),
        }
        for c in rows
    ]
    if not documents:
        return ""
    return yaml.dump_all(
        documents,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=True,
    )


def _mapping(cluster: Cluster, *, include_secrets: bool) -> dict[str, object]:
    mapping = cluster.proxmox_config(PLACEHOLDER_INSTALLATION).to_mapping()
    if "vendorData" in mapping and not include_secrets:
        mapping["vendorData"] = VENDOR_DATA_PLACEHOLDER
    return mapping
