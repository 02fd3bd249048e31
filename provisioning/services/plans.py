"""Plan preview and preflight for proxies (seed 003; DESIGN.md §5).

Thin doors onto ``provisioning.proxmox.plan`` and ``provisioning.proxmox.preflight``: they turn a
proxy (or a spec not saved yet) into the plan's inputs and write nothing. Seed 003: the preview
and the preflight "do not save a definition, enqueue a job or persist a plan", and neither opens
an operation. ``plan_preview`` and ``plan_for_spec`` make no Proxmox call; ``preflight_proxy``
makes only the preflight's bounded GETs, the one Proxmox call a web request may make
(STYLE.md, issue 5).

The cloud-init enters as the SHA-256 and length the proxy row already keeps, so previewing never
unseals it.

A proxy without a zone on a multi-node cluster is planned on the node placement would pick now
(``choose_node``, a read), marked "chosen by placement"; a proxy whose VM already exists is
planned on its observed node, where a create would find and adopt it.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioning import sealing
from provisioning.models import Cluster, Proxy
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.ids import vm_name as vm_name_for
from provisioning.proxmox.plan import Plan, build_plan
from provisioning.proxmox.preflight import PREFLIGHT_BUDGET, preflight
from provisioning.proxmox.preflight_checks import Check

from .credentials import cluster_credentials_validate, cluster_trust_ca_if_unrecorded
from .installation import installation_id
from .operations import ProxySpec
from .placement import choose_node
from .providers import provider_for
from .seeds import keep_seed_iso


@dataclass(frozen=True)
class PreflightReport:
    """The plan hash the checks were made for, and the checks in ``CHECK_CODES`` order.

    A report observes one moment; it reserves nothing and approves nothing (seed 003).
    """

    plan_hash: str
    checks: list[Check]

    @property
    def all_passed(self) -> bool:
        return bool(self.checks) and all(c.status == "passed" for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {
            status: sum(1 for c in self.checks if c.status == status)
            for status in ("passed", "failed", "unknown")
        }

    def as_dict(self) -> dict[str, object]:
        return {
            "planHash": self.plan_hash,
            "vmidReserved": False,
            "checks": [c.as_dict() for c in self.checks],
        }


def plan_preview(proxy: Proxy) -> Plan:
    """The plan of ``proxy``'s create, without a Proxmox call.

    Unknown catalogue keys raise the create's ``PermanentError`` (seed 000 entry 3).
    """
    config = proxy.cluster.proxmox_config(installation_id())
    return _plan_for_proxy(proxy, config)


def preflight_proxy(proxy: Proxy, *, deadline_seconds: float = PREFLIGHT_BUDGET) -> PreflightReport:
    """Check ``proxy``'s plan against Proxmox with GET requests only, within
    ``deadline_seconds`` in all.

    A tokenFile or caFile the rules refuse raises ``ValidationError`` naming the field before any
    request (issue 11); a CA with no trust recorded yet is trusted as it is now (first use).
    """
    cluster_credentials_validate(cluster=proxy.cluster)
    cluster_trust_ca_if_unrecorded(cluster=proxy.cluster)
    deadline = Deadline(deadline_seconds)
    provider = provider_for(proxy.cluster)
    plan = _plan_for_proxy(proxy, provider.config)
    checks = preflight(provider.api, provider.config, plan, deadline=deadline)
    return PreflightReport(plan_hash=plan.plan_hash, checks=checks)


def plan_for_spec(
    spec: ProxySpec,
    *,
    config: ProxmoxConfig | None = None,
    placement_node: str | None = None,
) -> Plan:
    """The plan for a proxy not saved yet (the bulk-create page).

    Its UID is drawn when it is created, so the plan has no UID and no VMID candidate; the rest
    is what ``plan_preview`` would show once it exists. A name that is not a DNS label raises
    ``PermanentError``.

    A batch passes its cluster's ``config`` and the node placement gave this proxy
    (``services.plan_confirmation``), so N plans cost no N reads of the catalogue or of
    placement's inputs.
    """
    if config is None:
        config = spec.cluster.proxmox_config(installation_id())
    if placement_node is None:
        placement_node = _placement(spec.cluster, config, zone=spec.zone, observed="")
    return build_plan(
        config,
        uid=None,
        vm_name=vm_name_for(spec.name),
        zone=spec.zone,
        machine_type=spec.machine_type,
        image=spec.image,
        cloud_init_sha256=sealing.digest(spec.cloud_init) if spec.cloud_init else "",
        cloud_init_bytes=len(spec.cloud_init),
        placement_node=placement_node,
        vendor_data_digest=_vendor_digest(config),
        keep_seed_iso=keep_seed_iso(),
    )


def _plan_for_proxy(proxy: Proxy, config: ProxmoxConfig) -> Plan:
    return build_plan(
        config,
        uid=proxy.uid,
        vm_name=proxy.vm_name,
        zone=proxy.zone,
        machine_type=proxy.machine_type,
        image=proxy.image,
        cloud_init_sha256=proxy.cloud_init_sha256,
        cloud_init_bytes=proxy.cloud_init_bytes,
        placement_node=_placement(proxy.cluster, config, zone=proxy.zone, observed=proxy.node),
        vendor_data_digest=_vendor_digest(config),
        keep_seed_iso=keep_seed_iso(),
    )


def _vendor_digest(config: ProxmoxConfig) -> str | None:
    """Keyed, like the cloud-init's: the plan hash is shown, and must confirm no guess."""
    return sealing.digest(config.vendor_data.encode("utf-8")) if config.vendor_data else None


def _placement(cluster: Cluster, config: ProxmoxConfig, *, zone: str, observed: str) -> str | None:
    """The node for a blank zone on a multi-node cluster; None when the zone decides."""
    if zone or len(config.nodes) <= 1:
        return None
    if observed and observed in config.nodes:
        return observed
    return choose_node(cluster, config)
