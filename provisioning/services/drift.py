"""When reconcile reads a proxy VM's config for drift, and what it records (issue 14).

Reconcile's round costs one listing per cluster; a converged proxy costs nothing more (issue 12
holds a round to at most 0.1 requests per Running proxy). Drift must keep that, so a converged
proxy's config is read only:

* when the listing shows possible drift: its ``maxcpu``/``maxmem`` differ from the spec's and
  from the figures the last config read saw (so one read explains a lasting difference, such
  as a template with two sockets, and it is not read again every round); or the proxy shows
  drift and the figures moved (someone may have set it back);
* on a slow rotation, because the listing shows neither net0 nor a pending change: a proxy whose
  config was last compared more than ``PROXYHUB_DRIFT_RECHECK_SECONDS`` ago (default 3,600 s,
  its create counting as a comparison), oldest first, at most
  ``ceil(PROXYHUB_DRIFT_ROTATION_SHARE x proxies)`` per cluster per round (default 0.05). With
  Beat's 60 s round that is a read per proxy per hour: 0.017 requests per proxy per round on
  average, 0.05 at most in any round of a fleet of 20 or more, and none at all in a round where
  no comparison is due.

A proxy that is read anyway (not yet Running, or its VM restarted) has its drift judged from
that same read, at no cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from provisioning.models import Proxy
from provisioning.models.choices import Phase
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.drift import Spec, config_drift, figures, spec_from_catalogue
from provisioning.proxmox.netcfg import net0_mac

RECHECK_SECONDS = 3600.0
ROTATION_SHARE = 0.05
# Phases whose VM is settled enough to compare: it exists and no operation is building it.
_SETTLED = (Phase.RUNNING, Phase.STOPPED)


def recheck_interval() -> timedelta:
    return timedelta(
        seconds=float(getattr(settings, "PROXYHUB_DRIFT_RECHECK_SECONDS", RECHECK_SECONDS))
    )


def rotation_share() -> float:
    return float(getattr(settings, "PROXYHUB_DRIFT_ROTATION_SHARE", ROTATION_SHARE))


def proxy_spec(proxy: Proxy, config: ProxmoxConfig) -> Spec | None:
    """What the proxy's VM was built with (``Proxy.vm_spec``); for a proxy from before it was
    recorded, the catalogue's figures today; None when neither is known."""
    if proxy.vm_spec:
        return Spec.from_record(proxy.vm_spec)
    return spec_from_catalogue(config, proxy.machine_type)


def rotation_due(proxies: Iterable[Proxy], now: datetime) -> set[int]:
    """The proxies whose comparison is due this round (module docstring), oldest first, capped."""
    settled = [p for p in proxies if p.provider_id and p.phase in _SETTLED]
    cutoff = now - recheck_interval()
    due = sorted(
        (p for p in settled if _last_compared(p) <= cutoff),
        key=_last_compared,
    )
    budget = math.ceil(rotation_share() * len(settled))
    return {p.pk for p in due[:budget]}


def _last_compared(proxy: Proxy) -> datetime:
    return proxy.drift_checked_at or proxy.created_at


def listing_suggests_drift(proxy: Proxy, entry: Mapping[str, Any], spec: Spec) -> bool:
    """Whether the listing's figures are worth a config read (module docstring)."""
    seen = figures(entry)
    if seen == proxy.drift_listing:
        return False  # the last read already explained these figures
    return seen != spec.figures() or bool(proxy.drift)


def drift_observed(
    proxy: Proxy,
    spec: Spec,
    sizing: Mapping[str, Any],
    entry: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The proxy's drift fields from one config read (``Instance.sizing``): what differs, when
    it was compared, the listing's figures then, and the spec, recorded the first time (the
    catalogue's figures and the MAC found, for a proxy from before specs were kept)."""
    if not spec.mac:
        spec = replace(spec, mac=net0_mac(sizing.get("net0")) or "")
    fields: dict[str, Any] = {
        "drift": [d.as_dict() for d in config_drift(sizing, spec)],
        "drift_checked_at": now,
        "drift_listing": figures(entry) if entry is not None else "",
        # The digest this read saw: what a confirmation page shows of the VM (issue 14).
        "config_digest": str(sizing.get("digest") or ""),
    }
    if proxy.vm_spec != spec.to_record():
        fields["vm_spec"] = spec.to_record()
    return fields


def built_spec(config: ProxmoxConfig, machine_type: str, mac: str) -> dict[str, Any]:
    """``Proxy.vm_spec`` for a VM a create just built: the catalogue it was built from, and
    net0's MAC as the create found it (empty when unknown)."""
    spec = spec_from_catalogue(config, machine_type, mac)
    return spec.to_record() if spec is not None else {}


def drift_summary(drift: Iterable[Mapping[str, Any]]) -> str:
    """One line for lists and logs: ``cores 2 (want 1); net0.tag unset (want 20)``."""
    return "; ".join(
        f"{d.get('field')} {d.get('have') or 'unset'} (want {d.get('want') or 'unset'})"
        for d in drift
    )
