"""The simulator's record of every Proxmox call it answered.

Tests count requests here, never in proxyhub's own database (STYLE.md, Tests). An entry holds
what identifies the call (method, schema key, path parameters), what came of it (status, the
fault acted out, the UPID it started) and whether it changed state. Request bodies are never
stored: descriptions, passwords and keys are kept as their length, uploads as file name and
size only (DESIGN.md §8).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Parameters recorded only by length: they may carry marks, secrets or keys.
_SUMMARISED = frozenset({"description", "cipassword", "sshkeys", "password", "cicustom"})


@dataclass(frozen=True)
class LedgerEntry:
    seq: int
    time: float  # the engine's clock when the call arrived
    method: str
    key: str | None  # schema key ("POST /nodes/{node}/qemu/{vmid}/clone"); None: no route
    path: str  # the path below /api2/json, decoded
    path_params: Mapping[str, str]
    params: Mapping[str, str]  # query/form parameters, sensitive ones summarised
    status: int  # what the engine answered (0 when only a fault was acted out)
    duration: float  # seconds the engine spent on it
    mutation: bool  # a POST/PUT/DELETE whose handler changed state
    upid: str | None = None  # the task it started
    fault: str | None = None  # "reset", "stall", "595"... when a fault was injected
    upload: Mapping[str, Any] | None = field(default=None)  # {"filename", "bytes"}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(params: Mapping[str, object]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        text = value if isinstance(value, str) else str(value)
        out[key] = f"<{len(text)} chars>" if key in _SUMMARISED else text
    return out


class Ledger:
    """Thread-safe, append-only until ``clear``."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._lock = threading.Lock()
        self._seq = 0

    def record(self, **fields: Any) -> LedgerEntry:
        with self._lock:
            self._seq += 1
            entry = LedgerEntry(seq=self._seq, **fields)
            self._entries.append(entry)
            return entry

    def calls(
        self, method: str | None = None, key: str | None = None, **path_params: object
    ) -> list[LedgerEntry]:
        """Entries, optionally only one method, one schema key (or its path template), and
        matching path parameters (``vmid=123`` matches ``"123"``)."""
        with self._lock:
            entries = list(self._entries)
        wanted = {k: str(v) for k, v in path_params.items()}
        return [e for e in entries if _matches(e, method, key) and _has(e, wanted)]

    def mutations(self, method: str | None = None, key: str | None = None) -> list[LedgerEntry]:
        return [e for e in self.calls(method, key) if e.mutation]

    def count(
        self, method: str | None = None, key: str | None = None, **path_params: object
    ) -> int:
        return len(self.calls(method, key, **path_params))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _matches(entry: LedgerEntry, method: str | None, key: str | None) -> bool:
    if method is not None and entry.method != method.upper():
        return False
    if key is None:
        return True
    if entry.key is None:
        return False
    # Either the full schema key or just its path template.
    return entry.key == key or entry.key.split(" ", 1)[1] == key


def _has(entry: LedgerEntry, wanted: Mapping[str, str]) -> bool:
    return all(entry.path_params.get(k) == v for k, v in wanted.items())
