"""How the console shows things: phase and state badges, shortened errors, ages, the Proxmox
console link, and an operation's progress and per-phase durations.

Everything here reads fields already loaded on the row (or, for an operation, its steps
fetched once), so list pages keep a constant query count whatever their size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import timesince

from provisioning.models import CircuitBreaker, CircuitState, Operation, OperationStep, Proxy
from provisioning.models.choices import OperationKind, OperationState, Phase, StepState
from provisioning.services.drift import drift_summary

# Badge colours (CSS classes in templates/admin/provisioning/badges.html): green once a proxy
# does its job, blue while work is under way, grey when stopped, red when an operator must act.
PHASE_TONE = {
    Phase.PENDING: "busy",
    Phase.CREATING: "busy",
    Phase.PROVISIONING: "busy",
    Phase.RUNNING: "ok",
    Phase.STOPPING: "busy",
    Phase.STOPPED: "idle",
    Phase.DELETING: "warn",
    Phase.FAILED: "bad",
}
STATE_TONE = {
    OperationState.QUEUED: "idle",
    OperationState.RUNNING: "busy",
    OperationState.WAITING: "busy",
    OperationState.SUCCEEDED: "ok",
    OperationState.FAILED: "bad",
    OperationState.UNKNOWN: "warn",
    StepState.RETRYING: "warn",
}
ERROR_SHOWN = 60


def badge(label: str, tone: str) -> SafeString:
    return format_html('<span class="ph-badge ph-{}">{}</span>', tone, label)


def phase_badge(phase: str) -> SafeString:
    return badge(phase, PHASE_TONE.get(phase, "idle"))  # type: ignore[call-overload]


def state_badge(state: str) -> SafeString:
    return badge(state, STATE_TONE.get(state, "idle"))  # type: ignore[call-overload]


def operation_state_badge(op: Operation) -> SafeString:
    """The operation's state; one held by a maintenance switch (issue 14) says so, since its
    ``waiting`` otherwise reads like a task still running in Proxmox."""
    if op.state == OperationState.WAITING and op.paused_since is not None:
        return badge("waiting for maintenance", "warn")
    return state_badge(op.state)


CIRCUIT_TONE = {CircuitState.CLOSED: "ok", CircuitState.HALF_OPEN: "warn", CircuitState.OPEN: "bad"}


def circuit_badge(breaker: CircuitBreaker | None) -> SafeString:
    """``closed``, ``half_open`` or ``open`` (a cluster that never failed has no row: closed)."""
    state = breaker.state if breaker is not None else CircuitState.CLOSED
    return badge(state, CIRCUIT_TONE.get(state, "idle"))  # type: ignore[call-overload]


def circuit_detail(breaker: CircuitBreaker | None) -> SafeString:
    """The breaker's state with when it opened, when it probes next and the failure seen."""
    if breaker is None:
        return format_html("{} (no connection failure recorded)", circuit_badge(None))
    parts = [f"{breaker.failures} connection failure(s) in a row"]
    if breaker.state != CircuitState.CLOSED and breaker.opened_at is not None:
        parts.append(f"open since {_clock(breaker.opened_at)}")
    if breaker.state == CircuitState.OPEN and breaker.retry_at is not None:
        parts.append(f"steps deferred until {_clock(breaker.retry_at)}, then one probes")
    if breaker.state == CircuitState.HALF_OPEN:
        parts.append("one step is probing the cluster now")
    parts.append(f"opened {breaker.times_opened} time(s) in all")
    return format_html(
        "{} {}<br>{}",
        circuit_badge(breaker),
        "; ".join(parts),
        short_error(breaker.last_error, limit=300) if breaker.last_error else "",
    )


def _clock(when: datetime) -> str:
    return timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S")


def short_error(text: str, limit: int = ERROR_SHOWN) -> SafeString | str:
    """The first ``limit`` characters, the whole message on hover."""
    if not text:
        return ""
    return format_html('<span title="{}">{}</span>', text, Truncator(text).chars(limit))


def drift_line(drift: Sequence[Mapping[str, Any]]) -> str:
    """The list column: ``cores 2 (want 1)``, one part per field, blank when in step."""
    return drift_summary(drift or [])


def drift_table(drift: Sequence[Mapping[str, Any]]) -> SafeString | str:
    """The change page: one row per field that differs, what the spec wants and what the VM has."""
    if not drift:
        return "none: the VM matched its spec at the last comparison"
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
        ((d.get("field"), d.get("want") or "unset", d.get("have") or "unset") for d in drift),
    )
    return format_html(
        "<table><thead><tr><th>field</th><th>want</th><th>have</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        rows,
    )


def vm_spec_line(spec: Mapping[str, Any]) -> str:
    """``1 cores, 1024 MiB, bridge vmbr0, tag 20, MAC bc:24:…``; blank until recorded."""
    if not spec:
        return "not recorded yet (the first comparison records the catalogue's figures)"
    parts = [f"{spec.get('cores')} cores", f"{spec.get('memoryMiB')} MiB"]
    if spec.get("bridge"):
        parts.append(f"bridge {spec['bridge']}")
    if spec.get("vlanTag") is not None:
        parts.append(f"tag {spec['vlanTag']}")
    if spec.get("mac"):
        parts.append(f"MAC {spec['mac']}")
    return ", ".join(parts)


def age(when: datetime | None, now: datetime | None = None) -> str:
    """``3 minutes``: the largest unit only, which is what a list column needs."""
    if when is None:
        return ""
    now = now or timezone.now()
    if (now - when).total_seconds() < 60:
        return "just now"
    return timesince(when, now, depth=1)


def console_url(proxy: Proxy) -> str:
    """The Proxmox web console of the proxy's VM (noVNC), on the host of the cluster's URL."""
    if proxy.vmid is None or not proxy.node:
        return ""
    host = urlsplit(proxy.cluster.url).hostname or ""
    if not host:
        return ""
    if ":" in host:  # an IPv6 literal goes in brackets
        host = f"[{host}]"
    query = urlencode({"console": "kvm", "novnc": 1, "vmid": proxy.vmid, "node": proxy.node})
    return f"https://{host}:8006/?{query}"


# How the journal's ``requested_via`` reads next to a user name.
_VIA = {"admin": "console", "command": "command", "beat": "Beat"}


def requested_by(op: Operation) -> str:
    """``olivia (console)``, or ``Beat`` for background work nobody asked for by hand."""
    via = _VIA.get(op.requested_via, op.requested_via)
    # The text kept at the time, so a deleted user's operations still say who asked.
    user = op.requested_by_name or (op.requested_by.get_username() if op.requested_by else "")
    return f"{user} ({via})" if user else via


def seconds(value: float | None) -> str:
    """``1.4 s``, ``2 min 05 s``: short and exact enough to compare runs."""
    if value is None:
        return ""
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


# --- operations -------------------------------------------------------------------------------

# The journal's step names per kind, in order (the provider's stages with ``_wait`` folded into
# the stage that submitted the task, plus the runner's ``address`` and ``seed_release``):
# create.py, delete.py and power.py. A replace deletes the old VM, then creates the new one.
_CREATE = (
    "lookup",
    "clone",
    "upload",
    "configure",
    "resize",
    "start",
    "running",
    "address",
    "seed_release",
)
_DELETE = ("inspect", "stop", "destroy", "seed")
_POWER = ("inspect", "submit", "wait", "settle")
STAGES: dict[str, tuple[str, ...]] = {
    OperationKind.CREATE: _CREATE,
    OperationKind.DELETE: _DELETE,
    OperationKind.REPLACE: _DELETE + _CREATE,
    OperationKind.START: _POWER,
    OperationKind.SHUTDOWN: _POWER,
    OperationKind.REBOOT: _POWER,
    OperationKind.REPAIR: (
        "inspect",
        "write",
        "check",
        "reboot",
        "reboot_wait",
        "verify",
        "address",
    ),
    # template_build.py (issue 14)
    OperationKind.TEMPLATE_BUILD: (
        "lookup",
        "download",
        "create",
        "resize",
        "convert",
        "verify",
    ),
}

# The phases an operator compares between runs (issue 5): queue is created → started; the
# others are the journal's step of that name; boot-to-address is the ``address`` step.
PHASES = (
    ("queue", None),
    ("clone", "clone"),
    ("upload", "upload"),
    ("configure", "configure"),
    ("resize", "resize"),
    ("start", "start"),
    ("boot-to-address", "address"),
)


@dataclass(frozen=True)
class PhaseDuration:
    name: str
    seconds: float | None
    running: bool = False

    @property
    def shown(self) -> str:
        text = seconds(self.seconds)
        return f"{text} so far" if self.running and text else text


def step_duration(step: OperationStep, now: datetime | None = None) -> float | None:
    """A finished step's duration, or how long a running one has taken so far."""
    end = step.finished_at or (now or timezone.now())
    return max(0.0, (end - step.started_at).total_seconds())


def phase_durations(
    op: Operation, steps: Sequence[OperationStep], now: datetime | None = None
) -> list[PhaseDuration]:
    """Queue time and the duration of each named phase the operation went through. A phase
    that ran more than once (a replace, a retried step) adds up."""
    now = now or timezone.now()
    out: list[PhaseDuration] = []
    for label, step_name in PHASES:
        if step_name is None:
            if op.started_at is not None:
                queued = (op.started_at - op.created_at).total_seconds()
                out.append(PhaseDuration(label, max(0.0, queued)))
            elif not op.finished:
                out.append(
                    PhaseDuration(label, (now - op.created_at).total_seconds(), running=True)
                )
            continue
        matching = [s for s in steps if s.name == step_name]
        if not matching:
            continue
        total = sum(step_duration(s, now) or 0.0 for s in matching)
        running = any(s.finished_at is None for s in matching) and not op.finished
        out.append(PhaseDuration(label, total, running=running))
    return out


def progress_percent(op: Operation, steps: Sequence[OperationStep]) -> int:
    """How far along the operation is, from the journal alone: the position of its latest
    step in the kind's stage list. Finished operations are at 100."""
    if op.finished:
        return 100
    stages = STAGES.get(op.kind, ())
    if not stages or not steps:
        return 0
    last = steps[-1]
    names = [s.name for s in steps]
    # For a replace the delete's ``inspect`` comes before the create's ``lookup``; the index of
    # the latest occurrence counts from the right part of the list.
    position = _position(stages, names)
    done = position + (1 if last.finished_at is not None else 0.5)
    return max(1, min(99, int(100 * done / len(stages))))


def _position(stages: Sequence[str], names: Iterable[str]) -> int:
    position = 0
    for name in names:
        for index in range(position, len(stages)):
            if stages[index] == name:
                position = index
                break
    return position


def elapsed(op: Operation, now: datetime | None = None) -> timedelta | None:
    if op.started_at is None:
        return None
    return (op.finished_at or now or timezone.now()) - op.started_at
