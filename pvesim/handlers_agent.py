"""Guest agent endpoints (pve-reference §3.3, §7.19). QGA results are wrapped in ``result``."""

from __future__ import annotations

from typing import Any

from . import agent
from .router import Ctx, handler
from .state import Guest, SimError


def _available(ctx: Ctx) -> Guest:
    guest = ctx.guest()
    agent.assert_agent(guest, ctx.sim.profile, ctx.now)
    return guest


@handler("GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces")
def network_get_interfaces(ctx: Ctx) -> dict[str, Any]:
    guest = _available(ctx)
    return {"result": agent.interfaces(guest, ctx.node, ctx.sim.profile, ctx.now)}


@handler("GET /nodes/{node}/qemu/{vmid}/agent/file-read")
def file_read(ctx: Ctx) -> dict[str, Any]:
    """A guest file through the agent (schema: ``file``, ``offset``, ``count`` up to 16 MiB,
    ``decode`` default 1); the answer is not wrapped in ``result``."""
    guest = _available(ctx)
    path = ctx.text("file") or ""
    text = agent.file_text(guest, ctx.sim.profile, path, ctx.now)
    return agent.file_read(
        text,
        offset=ctx.integer("offset", 0) or 0,
        count=ctx.integer("count", agent.FILE_READ_MAX) or agent.FILE_READ_MAX,
        decode=ctx.flag("decode", True),
    )


@handler("POST /nodes/{node}/qemu/{vmid}/agent/ping")
def ping(ctx: Ctx) -> dict[str, Any]:
    _available(ctx)
    return {"result": {}}


@handler("GET /nodes/{node}/qemu/{vmid}/agent/info")
def info(ctx: Ctx) -> dict[str, Any]:
    _available(ctx)
    return {"result": agent.info()}


@handler("GET /nodes/{node}/qemu/{vmid}/agent/get-osinfo")
def get_osinfo(ctx: Ctx) -> dict[str, Any]:
    _available(ctx)
    return {"result": dict(agent.OSINFO)}


@handler("POST /nodes/{node}/qemu/{vmid}/agent")
def command(ctx: Ctx) -> dict[str, Any]:
    """The generic form: the read commands the simulated agent supports."""
    guest = _available(ctx)
    name = ctx.params["command"]
    if name == "ping":
        return {"result": {}}
    if name == "info":
        return {"result": agent.info()}
    if name == "get-osinfo":
        return {"result": dict(agent.OSINFO)}
    if name == "network-get-interfaces":
        return {"result": agent.interfaces(guest, ctx.node, ctx.sim.profile, ctx.now)}
    if name == "get-host-name":
        return {"result": {"host-name": str(guest.config.get("name", f"vm{guest.vmid}"))}}
    raise SimError(500, "this feature or command is not currently supported")
