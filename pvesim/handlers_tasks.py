"""Task endpoints (pve-reference §4.2-4.4)."""

from __future__ import annotations

import re
from typing import Any

from .router import Ctx, Reply, handler
from .simtasks import UPID_RE, Task
from .state import SimError


def _task(ctx: Ctx) -> Task:
    """The task the path names, with Proxmox's two 400 texts (§3.8)."""
    upid = ctx.params["upid"]
    if not UPID_RE.fullmatch(upid):
        raise SimError.params({"upid": "unable to parse worker upid"})
    task = ctx.sim.scheduler.tasks.get(upid)
    if task is None or task.node != ctx.node_name:
        raise SimError.params({"upid": "no such task"})
    return task


def _identity(user: str) -> dict[str, str]:
    """A token identity is split: ``user`` = ``user@realm``, ``tokenid`` = the token name."""
    if "!" in user:
        owner, token = user.split("!", 1)
        return {"user": owner, "tokenid": token}
    return {"user": user}


@handler("GET /nodes/{node}/tasks/{upid}/status")
def task_status(ctx: Ctx) -> dict[str, Any]:
    task = _task(ctx)
    out: dict[str, Any] = {
        "id": task.id,
        "node": task.node,
        "pid": task.pid,
        "pstart": task.pstart,
        "starttime": task.starttime,
        "status": "running" if task.is_running else "stopped",
        "type": task.type,
        "upid": task.upid,
        **_identity(task.user),
    }
    if not task.is_running:
        out["exitstatus"] = task.exitstatus
    return out


@handler("GET /nodes/{node}/tasks/{upid}/log")
def task_log(ctx: Ctx) -> Reply:
    """Lines ``{n, t}`` from ``start`` (0-based), ``limit`` of them (default 50, 0 = all)."""
    task = _task(ctx)
    lines = task.log
    if not lines:
        return Reply([{"n": 1, "t": "no content"}], total=1)
    start = ctx.integer("start", 0) or 0
    limit = ctx.integer("limit", 50) or 0
    if ctx.flag("download"):
        start, limit = 0, 0
    end = len(lines) if limit == 0 else start + limit
    data = [{"n": i + 1, "t": lines[i]} for i in range(start, min(end, len(lines)))]
    return Reply(data, total=len(lines))


@handler("DELETE /nodes/{node}/tasks/{upid}")
def task_stop(ctx: Ctx) -> None:
    task = _task(ctx)
    ctx.sim.scheduler.interrupt(task, ctx.now)


_STATUS_TYPES = ("ok", "warning", "error", "unknown")


def _status_type(status: str | None) -> str:
    """pve-common's ``upid_normalize_status_type``: a task with no status yet (running) is
    ``unknown``, as is one whose log ended without a status line."""
    if not status or status == "unexpected status":
        return "unknown"
    if status == "OK":
        return "ok"
    if re.fullmatch(r"WARNINGS: \d+", status):
        return "warning"
    return "error"


def _status_types(statusfilter: str | None, *, errors: bool) -> set[str]:
    """The status types a list keeps: all; those ``statusfilter`` names (a list split on
    commas, semicolons or blanks); with ``errors``, all but ``ok`` (it wins over the filter)."""
    if errors:
        return set(_STATUS_TYPES) - {"ok"}
    if statusfilter is None:
        return set(_STATUS_TYPES)
    return {part.lower() for part in re.split(r"[\s,;]+", statusfilter) if part}


@handler("GET /nodes/{node}/tasks")
def task_list(ctx: Ctx) -> Reply:
    """Finished tasks by default (``source=archive``), newest first; ``active``/``all``.

    The filters as pve-manager's ``PVE/API2/Tasks.pm`` applies them (pve-reference §4.4):
    ``typefilter`` is the exact type, ``userfilter`` a part of the user in any case, ``vmid``
    the exact id, ``since``/``until`` bound the start time, and ``statusfilter`` (or
    ``errors``, which only drops ``ok``) takes the normalised status (``_status_type``)."""
    source = ctx.text("source", "archive")
    vmid = ctx.text("vmid")
    typefilter = ctx.text("typefilter")
    userfilter = (ctx.text("userfilter") or "").lower()
    since = ctx.integer("since")
    until = ctx.integer("until")
    wanted = _status_types(ctx.text("statusfilter"), errors=ctx.flag("errors"))
    selected: list[Task] = []
    for task in ctx.sim.scheduler.tasks.values():
        if task.node != ctx.node_name:
            continue
        if source == "archive" and task.is_running:
            continue
        if source == "active" and not task.is_running:
            continue
        if vmid is not None and task.id != vmid:
            continue
        if typefilter and task.type != typefilter:
            continue
        if userfilter and userfilter not in task.user.lower():
            continue
        if since is not None and task.starttime < since:
            continue
        if until is not None and task.starttime > until:
            continue
        if _status_type(None if task.is_running else task.exitstatus) not in wanted:
            continue
        selected.append(task)
    selected.sort(key=lambda t: (t.starttime, t.pid), reverse=True)
    start = ctx.integer("start", 0) or 0
    limit = ctx.integer("limit", 50) or 0
    page = selected[start : start + limit] if limit else selected[start:]
    data = []
    for task in page:
        item: dict[str, Any] = {
            "id": task.id,
            "node": task.node,
            "pid": task.pid,
            "pstart": task.pstart,
            "starttime": task.starttime,
            "type": task.type,
            "upid": task.upid,
            "user": task.user,
        }
        if task.is_running:
            item["status"] = "RUNNING"
        else:
            item["status"] = task.exitstatus
            assert task.ended_at is not None
            item["endtime"] = ctx.cluster.wall(task.ended_at)
        data.append(item)
    return Reply(data, total=len(selected))
