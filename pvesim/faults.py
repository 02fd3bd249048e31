"""Injected faults: error rates, scripted failures of the Nth call, latency.

Rules match a method and a schema path template (``/nodes/{node}/qemu/{vmid}/clone``); either
may be ``None`` for "any". Kinds:

``500``     the handler does not run; 500 ``can't lock file '...' - got timeout``, the lock
            timeout Proxmox answers when storage or config locks are contended (peers.md §6);
``595``     empty body, reason ``Connection refused`` (pveproxy could not reach the node);
``596``     empty body, reason ``Connection timed out``;
``reset``   the connection is closed without an answer;
``stall``   the connection stays open without an answer until the client gives up;
``drop``    the request is *applied*, then the connection is closed: the reply is lost after
            the mutation happened (same as ``reset`` with ``applied=True``);
``status``  an arbitrary ``status`` and ``message``.

Any kind can be made ``applied``: the handler runs and changes state, then the client gets
the fault instead of the answer (a 596 "while the work continues on the server", §1.4).
Scripted rules are deterministic (the Nth matching call, ``times`` calls in a row); rate rules
draw from the engine's seeded generator, so a run with the same seed fails the same calls.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from . import replies
from .protocol import SimResponse

KINDS = ("500", "595", "596", "reset", "stall", "drop", "status")


@dataclass
class FaultRule:
    id: int
    kind: str
    method: str | None = None
    path: str | None = None
    rate: float | None = None  # rate rules: probability per matching call
    nth: int | None = None  # scripted rules: the first matching call that fails (1-based)
    times: int = 1  # scripted rules: how many matching calls in a row fail
    status: int | None = None
    message: str | None = None
    applied: bool = False
    seen: int = 0
    fired: int = 0

    def matches(self, method: str, key: str | None) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        if self.path is None:
            return True
        return key is not None and key.split(" ", 1)[1] == self.path

    @property
    def after_apply(self) -> bool:
        return self.applied or self.kind == "drop"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LatencyRule:
    seconds: float
    method: str | None = None
    path: str | None = None

    def matches(self, method: str, key: str | None) -> bool:
        return FaultRule(0, "status", self.method, self.path).matches(method, key)


class Faults:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._ids = itertools.count(1)
        self.rules: list[FaultRule] = []
        self.latency: list[LatencyRule] = []

    def add(self, **fields: Any) -> FaultRule:
        kind = str(fields.get("kind", "500"))
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (one of: {', '.join(KINDS)})")
        if kind == "status" and not fields.get("status"):
            raise ValueError("a 'status' fault needs a status")
        rule = FaultRule(id=next(self._ids), **fields)
        if rule.rate is None and rule.nth is None:
            raise ValueError("a fault needs a rate or an nth call")
        if rule.rate is not None and not 0.0 <= rule.rate <= 1.0:
            raise ValueError("rate must be between 0 and 1")
        if rule.nth is not None and rule.nth < 1:
            raise ValueError("nth counts from 1")
        self.rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> None:
        self.rules = [r for r in self.rules if r.id != rule_id]

    def clear(self) -> None:
        self.rules.clear()
        self.latency.clear()

    def pick(self, method: str, key: str | None) -> FaultRule | None:
        """The rule that fails this call, if any. Every matching rule counts the call."""
        chosen: FaultRule | None = None
        for rule in self.rules:
            if not rule.matches(method, key):
                continue
            rule.seen += 1
            if chosen is not None:
                continue
            if rule.nth is not None:
                hit = rule.nth <= rule.seen < rule.nth + rule.times
            else:
                hit = self._rng.random() < (rule.rate or 0.0)
            if hit:
                rule.fired += 1
                chosen = rule
        return chosen

    def delay_for(self, method: str, key: str | None) -> float:
        return sum(r.seconds for r in self.latency if r.matches(method, key))


def fault_response(rule: FaultRule, path_params: Mapping[str, str]) -> SimResponse:
    kind = rule.kind
    if kind == "500":
        return replies.error(500, _lock_timeout(path_params))
    if kind == "595":
        return replies.empty(595, rule.message or "Connection refused")
    if kind == "596":
        return replies.empty(596, rule.message or "Connection timed out")
    if kind in ("reset", "drop"):
        return SimResponse(0, "connection reset", None, fault="reset")
    if kind == "stall":
        return SimResponse(0, "stalled", None, fault="stall")
    status = int(rule.status or 500)
    message = rule.message or "injected failure"
    if status == 401 or status >= 595:
        return replies.empty(status, message)
    return replies.error(status, message)


def _lock_timeout(path_params: Mapping[str, str]) -> str:
    if "vmid" in path_params:
        target = f"/var/lock/qemu-server/lock-{path_params['vmid']}.conf"
    elif "storage" in path_params:
        target = f"/var/lock/pve-manager/pve-storage-{path_params['storage']}"
    else:
        return "got timeout"
    return f"can't lock file '{target}' - got timeout"
