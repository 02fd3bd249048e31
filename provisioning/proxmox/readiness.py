"""Whether cloud-init has finished in a guest, from its result file (seed 003's readiness).

Seed 003: "an address counts only when it is an IPv4 on the interface whose MAC is net0's
(``addresses.py``) and, when the catalogue asks for it, after cloud-init has reported done". The
catalogue asks per template (``waitForCloudInit``). cloud-init writes
``/run/cloud-init/result.json`` once its last stage has run, ``{"v1": {"errors": [...]}}``;
Proxmox reads a guest file through the agent, ``GET .../agent/file-read`` (schema
all-endpoints.json; privilege ``VM.GuestAgent.FileRead``). What one read says:

* the file is there with no errors: done;
* the file is there with errors: cloud-init failed, and no waiting heals that (the user-data or
  the image must change), so the create ends and says what the errors were and what to do;
* the file is not there yet (the agent's "No such file or directory"), the agent has stopped
  answering for a moment, or the read caught the file half-written: not done yet, look again
  within the address budget;
* anything else (the VM stopped, gone, the privilege missing) is raised for the caller.

The errors are summarised, bounded, and never carry the user-data: cloud-init's errors may quote
the part that failed, so any line of the proxy's cloud-init found in them is replaced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .api import Api
from .deadline import Deadline
from .errors import ApiError

RESULT_FILE = "/run/cloud-init/result.json"
# The agent's answer for a file the guest does not have (qemu-ga guest-file-open's errno text,
# "Agent error: failed to open file '...' (mode: 'r'): No such file or directory").
_NO_FILE = "No such file or directory"
_AGENT_NOT_RUNNING = "QEMU guest agent is not running"
# What a summary keeps: this many errors, each cut to this many characters, and at most this
# many characters in all (a broken image can report hundreds, each with a traceback).
MAX_ERRORS = 3
MAX_ERROR_CHARS = 160
MAX_SUMMARY_CHARS = 600
# A cloud-init line shorter than this is too common to hide ("#cloud-config", "runcmd:").
_REDACT_MIN = 8
_REDACTED = "[user-data]"

State = Literal["pending", "done", "failed"]


@dataclass(frozen=True)
class CloudInitStatus:
    """What one read of the result file said; ``errors`` as cloud-init reported them."""

    state: State
    errors: tuple[str, ...] = ()
    why: str = ""  # for ``pending``: what the look saw (the log and the journal show it)


def cloud_init_status(
    api: Api, node: str, vmid: int, *, deadline: Deadline | None = None
) -> CloudInitStatus:
    """One ``file-read`` of cloud-init's result file in VM ``vmid`` (module docstring)."""
    try:
        answer = api.agent_file_read(node, vmid, RESULT_FILE, deadline=deadline)
    except ApiError as err:
        if err.status == 500 and _NO_FILE in err.message:
            return CloudInitStatus("pending", why="cloud-init has not written its result yet")
        if err.status == 500 and _AGENT_NOT_RUNNING in err.message:
            return CloudInitStatus("pending", why="the guest agent is not answering")
        raise
    return parse_result(answer)


def parse_result(answer: Mapping[str, object]) -> CloudInitStatus:
    """The status a ``file-read`` answer holds."""
    content = answer.get("content")
    if answer.get("truncated") or not isinstance(content, str):
        # Over 16 MiB is not a result file cloud-init writes; read as "not readable yet".
        return CloudInitStatus("pending", why="the result file could not be read whole")
    try:
        document = json.loads(content)
    except ValueError:
        # cloud-init writes the file in place: a read may catch it half-written.
        return CloudInitStatus("pending", why="the result file is being written")
    v1 = document.get("v1") if isinstance(document, Mapping) else None
    if not isinstance(v1, Mapping) or not isinstance(v1.get("errors"), list):
        return CloudInitStatus("pending", why="the result file has no v1.errors yet")
    errors = tuple(str(e) for e in v1["errors"])
    return CloudInitStatus("failed" if errors else "done", errors)


def summarise(errors: tuple[str, ...], *, user_data: bytes = b"") -> str:
    """``errors`` in one bounded line, with every line of ``user_data`` found in them hidden."""
    hidden = sorted(_user_data_pieces(user_data), key=len, reverse=True)
    parts = []
    for error in errors[:MAX_ERRORS]:
        text = " ".join(error.split())
        for line in hidden:
            text = text.replace(line, _REDACTED)
        if len(text) > MAX_ERROR_CHARS:
            text = text[: MAX_ERROR_CHARS - 3] + "..."
        parts.append(text)
    more = len(errors) - MAX_ERRORS
    summary = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[: MAX_SUMMARY_CHARS - 3] + "..."
    return summary


def _user_data_pieces(user_data: bytes) -> set[str]:
    """What of ``user_data`` an error could quote: each line, without YAML's list dash, key or
    quotes (a ``runcmd`` entry ``- curl ...`` fails as ``curl ...``), long enough to matter."""
    out: set[str] = set()
    for raw in user_data.decode(errors="replace").splitlines():
        line = " ".join(raw.split())
        bare = line.lstrip("- ").strip().strip("'\"")
        candidates = {line, bare}
        if ": " in bare:
            candidates.add(bare.split(": ", 1)[1].strip().strip("'\""))
        out.update(c for c in candidates if len(c) >= _REDACT_MIN)
    return out
