"""The VM config digest as a confirmation condition (seed 001, issue 14).

Seed 001: "Configuration digests are additional confirmation conditions." Proxmox returns a
``digest`` with every ``GET /nodes/{node}/qemu/{vmid}/config`` (the SHA-1 of the config file,
pve-reference §7.11); any edit of the config moves it. A confirmation page shows the digest of
each target and the confirmed action carries it; right before its mutation the worker reads the
config again and refuses a VM whose digest differs, so a VM edited since it was shown is not
acted on unreviewed.
"""

from __future__ import annotations

REMEDY = "review and confirm again"


def digest_changed(expected: str, now: str) -> str | None:
    """Why a VM confirmed with config digest ``expected`` is refused now, or None. No expected
    digest (no page showed one: a command, reconcile) binds nothing."""
    if not expected or expected == now:
        return None
    return (
        f"the VM's config changed since it was shown: digest {expected[:12]} → {now[:12] or 'none'}"
    )
