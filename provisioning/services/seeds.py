"""What becomes of a proxy's seed ISO after its first boot (issue 11).

The seed holds the proxy's user-data, secrets included. By default a create or replace releases
it once the guest has reported its address (``proxmox.release``); ``PROXYHUB_KEEP_SEED_ISO``
keeps it attached and on storage, for images that read their cloud-init on every boot. The
runner follows it, and the plan preview shows it, so both read it here.
"""

from __future__ import annotations

from django.conf import settings

# The stage of a create or replace whose seed is being released: the runner writes it, and the
# task slots read it (the removal's node; it yields a freed slot to every other waiting step).
SEED_RELEASE_STAGE = "seed_release"


def keep_seed_iso() -> bool:
    """``PROXYHUB_KEEP_SEED_ISO`` (default false), read on every use so a change needs no
    restart of the code that asks."""
    return bool(getattr(settings, "PROXYHUB_KEEP_SEED_ISO", False))
