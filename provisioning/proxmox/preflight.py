"""The preflight: a plan checked against Proxmox with GET requests only (seed 003).

Seed 003: "bounded, verified-TLS GET requests"; each check is ``passed``, ``failed`` or
``unknown``; "an unavailable endpoint, missing permission or insufficient metadata must not
become a successful check"; "messages are fixed application text; raw provider configuration
and responses are not forwarded". So:

* every request goes through ``read_only(api)``, whose transport refuses anything but GET;
  nothing is cloned, uploaded, written, reserved or journaled (``preflight_reads.py``);
* a check passes only on an observation that proves its claim. A 403, a node that does not
  answer, a timeout, a 4xx/5xx nobody expected or a bug in the check make it ``unknown``; a
  check that depends on a read that failed is ``unknown`` too, never ``passed``;
* messages are written in ``preflight_checks.py``. They name only what proxyhub chose and
  never echo a Proxmox message, body, or a value read from a config;
* the whole run is bounded by one ``Deadline`` (``PREFLIGHT_BUDGET`` seconds unless the caller
  passes one); each request is bounded by it, and once it ends the remaining reads fail at
  once and their checks say so.

This module runs the checks in ``CHECK_CODES`` order, each guarded so that a bug in one leaves
the others standing, and logs the outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .api import Api
from .config import ProxmoxConfig
from .deadline import Deadline
from .plan import Plan
from .preflight_checks import Check, PreflightChecks
from .preflight_reads import read_only

log = logging.getLogger("proxyhub.proxmox.preflight")

# Seconds the whole preflight may take when the caller gives no deadline (seed 003: bounded).
PREFLIGHT_BUDGET = 10.0

CHECK_CODES = (
    "template_exists",
    "template_is_template",
    "template_no_cloudinit_drive",
    "template_boot_disk",
    "iso_storage",
    "target_storage",
    "bridge",
    "vmid_candidate",
    "node_online",
    "privileges",
)


def preflight(
    api: Api, config: ProxmoxConfig, plan: Plan, *, deadline: Deadline | None = None
) -> list[Check]:
    """Check ``plan`` against Proxmox with GET requests only; one ``Check`` per applicable
    code, in ``CHECK_CODES`` order (``template_boot_disk`` only when the plan sets diskGiB,
    ``privileges`` only when the cluster has a pool)."""
    if plan.cluster != config.name:
        raise ValueError(f"the plan is for cluster {plan.cluster}, not {config.name}")
    started = time.monotonic()
    budget = deadline if deadline is not None else Deadline(PREFLIGHT_BUDGET)
    checks = _run(PreflightChecks(read_only(api), config, plan, budget))
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("passed", "failed", "unknown")}
    log.info(
        "proxmox preflight",
        extra={
            "cluster": config.name,
            "vm_name": plan.vm_name,
            "plan_hash": plan.plan_hash,
            **counts,
            "duration": round(time.monotonic() - started, 4),
        },
    )
    return checks


def _run(checks: PreflightChecks) -> list[Check]:
    runs: list[tuple[str, Callable[[], Check]]] = [
        ("template_exists", checks.template_exists),
        ("template_is_template", checks.template_is_template),
        ("template_no_cloudinit_drive", checks.template_no_cloudinit_drive),
    ]
    if checks.plan.disk_gib is not None:
        runs.append(("template_boot_disk", checks.template_boot_disk))
    runs += [
        ("iso_storage", checks.iso_storage),
        ("target_storage", checks.target_storage),
        ("bridge", checks.bridge),
        ("vmid_candidate", checks.vmid_candidate),
        ("node_online", checks.node_online),
    ]
    if checks.config.pool:
        # Issue 14: a bootstrapped cluster's token is checked against what the create needs.
        runs.append(("privileges", checks.privileges))
    return [_guarded(code, check) for code, check in runs]


def _guarded(code: str, run: Callable[[], Check]) -> Check:
    try:
        return run()
    except Exception:
        # A bug or an answer of a shape nobody expected: this check says so, the others
        # stand. The traceback goes to the log only.
        log.exception("preflight check failed unexpectedly", extra={"check": code})
        return Check(code, "unknown", f"{code} could not be checked: the check failed")
