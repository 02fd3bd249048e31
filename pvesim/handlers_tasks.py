"""Task endpoints (pve-reference §4.2-4.4)."""

from __future__ import annotations

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


@handler("GET /nodes/{node}/tasks")
def task_list(ctx: Ctx) -> Reply:
    """Finished tasks by default (``source=archive``), newest first; ``active``/``all``."""
    source = ctx.text("source", "archive")
    vmid = ctx.text("vmid")
    typefilter = ctx.text("typefilter")
    userfilter = ctx.text("userfilter")
    errors_only = ctx.flag("errors")
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
        if typefilter and typefilter not in task.type:
            continue
        if userfilter and userfilter not in task.user:
            continue
        if errors_only and (task.is_running or task.exitstatus == "OK"):
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
