"""The one Proxmox read a power confirmation page makes: each target judged as seed 001 asks.

A confirmation page "shows the exact targets" (DESIGN.md §5): the node, the VMID, the state
and what will be refused, read through ``Provider.inspect_power``. These are the only Proxmox
calls the console makes in a web request besides preflight, so they are bounded: one
``/cluster/resources`` listing per cluster, at most ``INSPECT_MAX`` targets, and one deadline
for the whole page. A target left over is shown as not inspected and is judged again by the
worker before anything is sent (``power.PowerMachine``'s ``inspect`` and ``submit`` stages).

Each judged target's config digest is shown and carried to the confirm (seed 001, issue 14);
the replace page reads the digests alone (``read_digests``), under the same bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from provisioning.models import Proxy
from provisioning.models.choices import DesiredState
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import NotFoundError, classify
from provisioning.proxmox.identity import Identity
from provisioning.proxmox.ids import parse_provider_id
from provisioning.proxmox.power_checks import Action, PowerPreview, PowerRequest
from provisioning.services.providers import provider_for

log = logging.getLogger(__name__)

# A page must answer while the operator waits; a slow or unreachable cluster leaves the rest
# of the targets "not inspected" rather than hanging the request.
INSPECT_SECONDS = 10.0
INSPECT_MAX = 50


@dataclass(frozen=True)
class PowerTarget:
    """One proxy on a power confirmation page.

    ``preview`` is Proxmox's answer; ``skip`` says why the action will not be sent for this
    proxy (no VM, being deleted, the VM is gone, or seed 001's refusal); ``unknown`` says why
    the VM could not be judged now (the worker judges it again before sending).
    """

    proxy: Proxy
    preview: PowerPreview | None = None
    skip: str = ""
    unknown: str = ""

    @property
    def submits(self) -> bool:
        return not self.skip

    @property
    def node(self) -> str:
        return self.preview.node if self.preview else self.proxy.node

    @property
    def vmid(self) -> int | None:
        return self.preview.vmid if self.preview else self.proxy.vmid

    @property
    def state(self) -> str:
        if self.preview is None:
            return ""
        p = self.preview
        state = p.status if p.qmpstatus in ("", p.status) else f"{p.status} ({p.qmpstatus})"
        return f"{state}, lock: {p.lock}" if p.lock else state

    @property
    def outcome(self) -> str:
        """What will happen, in one sentence for the page."""
        if self.skip:
            return "not sent"
        if self.unknown:
            return self.unknown
        assert self.preview is not None
        if self.preview.noop:
            return self.preview.noop
        return "will be sent"


def power_targets(
    proxies: Iterable[Proxy], action: Action, expected: Mapping[int, str] | None = None
) -> list[PowerTarget]:
    """Judge each proxy's VM for ``action`` within the page's budget (see the module doc).

    ``expected`` maps a proxy's id to the config digest its confirmation page showed (issue
    14): on the confirm, a VM whose config has another digest now is refused."""
    deadline = Deadline(INSPECT_SECONDS)
    listings: dict[int, Any] = {}
    out: list[PowerTarget] = []
    inspected = 0
    for proxy in proxies:
        if proxy.desired_state == DesiredState.DELETED:
            out.append(PowerTarget(proxy, skip=f"{proxy.name} is being deleted"))
            continue
        if not proxy.provider_id:
            out.append(PowerTarget(proxy, skip=f"{proxy.name} has no VM yet"))
            continue
        if inspected >= INSPECT_MAX or (deadline.remaining() or 0.0) <= 0:
            out.append(PowerTarget(proxy, unknown=_NOT_INSPECTED))
            continue
        inspected += 1
        out.append(_judge(proxy, action, listings, deadline, (expected or {}).get(proxy.pk, "")))
    return out


def shown_digests(targets: Iterable[PowerTarget]) -> dict[int, str]:
    """The config digest read of each target judged, by proxy id."""
    return {t.proxy.pk: t.preview.digest for t in targets if t.preview and t.preview.digest}


def read_digests(proxies: Iterable[Proxy]) -> dict[int, str]:
    """The live config digest of each proxy's VM (the replace page), within the page's budget;
    a VM that cannot be read now is left out, and its last seen digest stands in."""
    deadline = Deadline(INSPECT_SECONDS)
    out: dict[int, str] = {}
    for count, proxy in enumerate(proxies):
        if count >= INSPECT_MAX or (deadline.remaining() or 0.0) <= 0:
            break
        if not proxy.provider_id or not proxy.node:
            continue
        try:
            vmid = parse_provider_id(proxy.provider_id).vmid
            config = provider_for(proxy.cluster).api.vm_config(proxy.node, vmid, deadline=deadline)
        except Exception as raw:  # shown as the last digest seen; the worker checks the VM
            log.info(
                "config digest not read",
                extra={"proxy": proxy.name, "reason": classify("get", raw).message},
            )
            continue
        if config.get("digest"):
            out[proxy.pk] = str(config["digest"])
    return out


_NOT_INSPECTED = "not inspected on this page (too many targets); checked again before sending"


def _judge(
    proxy: Proxy, action: Action, listings: dict[int, Any], deadline: Deadline, expected: str
) -> PowerTarget:
    try:
        provider = provider_for(proxy.cluster)
        if proxy.cluster_id not in listings:
            listings[proxy.cluster_id] = provider.api.cluster_resources(deadline=deadline)
        # The recorded identity too (seed 001): a re-created VM is refused on the page already.
        request = PowerRequest.from_provider_id(
            action,
            proxy.provider_id,
            str(proxy.uid),
            Identity(proxy.smbios_uuid, proxy.vmgenid),
        )
        request = replace(request, expected_digest=expected)
        preview = provider.inspect_power(
            request, listing=listings[proxy.cluster_id], deadline=deadline
        )
    except Exception as raw:  # every failure is shown classified, never as a raw body
        err = classify("power", raw)
        if isinstance(err, NotFoundError):
            return PowerTarget(proxy, skip=f"{err.message}; reconcile replaces a vanished VM")
        if err.kind == "permanent":
            return PowerTarget(proxy, skip=str(err))
        return PowerTarget(
            proxy, unknown=f"could not be read now ({err.message}); checked again before sending"
        )
    if preview.refusal:
        return PowerTarget(proxy, preview, skip=f"refused: {preview.refusal}")
    return PowerTarget(proxy, preview)
