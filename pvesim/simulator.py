"""The simulator as its front ends serve it: the engine, with the control surface beside it.

``Simulator`` is an ``Engine`` (everything under ``/api2/json``, and every Python attribute tests
read: ``token``, ``ledger``, ``cluster``...) that also answers ``/_sim/...`` through its
``control``. The engine never learns of the control surface; the composition happens here, one
floor above both, so ``engine.py`` and ``control.py`` import in one direction only.
"""

from __future__ import annotations

from functools import cached_property

from .control import CONTROL_PREFIX, Control
from .engine import Engine
from .protocol import SimRequest, SimResponse


class Simulator(Engine):
    """A Proxmox VE cluster in memory plus the back door tests use on it (DESIGN.md §7a)."""

    @cached_property
    def control(self) -> Control:
        """The ``/_sim`` surface over this engine; it holds no state of its own."""
        return Control(self)

    def handle(self, request: SimRequest) -> SimResponse:
        path = request.path.split("?", 1)[0]
        if path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/"):
            return self.control.http(request)
        return super().handle(request)
