"""QEMU guest endpoints: list, config, pending, status, power, destroy (pve-reference §7.11-7.18).

Which checks are synchronous (an error status) and which happen inside the task (200 + a UPID
whose task ends with ``TASK ERROR``) follows pve-reference §3 and §8 rule 3 exactly: that
difference is what a client's error handling is built on.
"""

from __future__ import annotations

from typing import Any

from .configupdate import ConfigUpdate, owned_volumes
from .power import check_media, launch, power_off, restart
from .resources import boot_disk_size, guest_usage
from .router import Ctx, Reply, handler
from .simtasks import Task, WaitFor
from .state import Guest, SimError, TaskError, config_missing
from .vmconfig import agent_enabled

MIB = 1024 * 1024
# qemu-server's ``lock_config`` waits this long for the config file lock (seconds).
LOCK_TIMEOUT = 10.0


def _root_only(ctx: Ctx, *names: str) -> None:
    """Only ``root@pam`` may use these; a token (even root's) never is root (§2.1)."""
    for name in names:
        if ctx.params.get(name) not in (None, "0"):
            raise SimError.params({name: "Only root may use this option."})


def _not_found_on_node(ctx: Ctx) -> SimError:
    return SimError(
        500, f"unable to find configuration file for VM {ctx.vmid} on node '{ctx.node_name}'"
    )


def _lookup(ctx: Ctx) -> Guest | None:
    guest = ctx.cluster.guests.get(ctx.vmid)
    if guest is None or guest.node != ctx.node_name or guest.kind != "qemu":
        return None
    return guest


# --- reading -------------------------------------------------------------------------------


@handler("GET /nodes/{node}/qemu")
def vm_list(ctx: Ctx) -> list[dict[str, Any]]:
    out = []
    for guest in ctx.cluster.guests_in_string_order():
        if guest.node != ctx.node_name or guest.kind != "qemu":
            continue
        if not ctx.perms.has(f"/vms/{guest.vmid}", "VM.Audit"):
            continue
        usage = guest_usage(guest, ctx.now)
        entry: dict[str, Any] = {
            "vmid": guest.vmid,
            "name": guest.name,
            "status": guest.status,
            "cpus": guest.cpus(),
            "maxmem": guest.memory_mib() * MIB,
            "maxdisk": boot_disk_size(guest),
            "disk": 0,
            **{k: usage[k] for k in ("cpu", "mem", "netin", "netout", "diskread", "diskwrite")},
            "uptime": usage["uptime"],
        }
        if guest.running:
            entry["pid"] = guest.pid
        if ctx.flag("full"):
            entry["qmpstatus"] = guest.qmpstatus
        for key in ("lock", "tags"):
            if guest.config.get(key):
                entry[key] = guest.config[key]
        if guest.is_template:
            entry["template"] = 1
        out.append(entry)
    return out


@handler("GET /nodes/{node}/qemu/{vmid}/config")
def vm_config(ctx: Ctx) -> dict[str, Any]:
    """Pending values merged in unless ``current=1``; always the ``digest`` (§7.11)."""
    guest = ctx.guest()
    snapshot = ctx.text("snapshot")
    if snapshot:
        raise SimError(500, f"snapshot '{snapshot}' does not exist")
    config = dict(guest.config) if ctx.flag("current") else guest.merged()
    if "cipassword" in config:
        config["cipassword"] = "**********"
    out = {k: config[k] for k in sorted(config)}
    out["digest"] = guest.digest
    return out


@handler("GET /nodes/{node}/qemu/{vmid}/pending")
def vm_pending(ctx: Ctx) -> list[dict[str, Any]]:
    """Every current key with ``value``, ``pending``/``delete`` where set; pending-only keys
    have no ``value`` (§7.12, examples/qemu_pending.json)."""
    guest = ctx.guest()
    items: list[dict[str, Any]] = []
    for key in sorted([*guest.config, "digest"]):
        if key == "digest":
            items.append({"key": "digest", "value": guest.digest})
            continue
        item: dict[str, Any] = {"key": key, "value": guest.config[key]}
        if key in guest.pending:
            item["pending"] = guest.pending[key]
        if key in guest.pending_delete:
            item["delete"] = 2 if guest.pending_delete[key] else 1
        items.append(item)
    for key in sorted(k for k in guest.pending if k not in guest.config):
        items.append({"key": key, "pending": guest.pending[key]})
    return items


def status_current(ctx: Ctx, guest: Guest) -> dict[str, Any]:
    """§7.17: live state; ``ha`` object, conditional ``lock``/``tags``/``template``/``agent``."""
    usage = guest_usage(guest, ctx.now)
    out: dict[str, Any] = {
        "cpu": usage["cpu"],
        "cpus": guest.cpus(),
        "disk": 0,
        "ha": {"managed": 0} if guest.ha_state is None else {"managed": 1, "state": guest.ha_state},
        "maxdisk": boot_disk_size(guest),
        "maxmem": guest.memory_mib() * MIB,
        "mem": usage["mem"],
        "memhost": usage["memhost"],
        "name": guest.name,
        "netin": usage["netin"],
        "netout": usage["netout"],
        "qmpstatus": guest.qmpstatus if guest.running else "stopped",
        "status": guest.status,
        "uptime": usage["uptime"],
        "vmid": guest.vmid,
    }
    config = guest.config
    if guest.lock:
        out["lock"] = guest.lock
    if config.get("tags"):
        out["tags"] = config["tags"]
    if guest.is_template:
        out["template"] = 1
    if "agent" in config and agent_enabled(config["agent"]):
        out["agent"] = 1
    if any(k.startswith("serial") for k in config):
        out["serial"] = 1
    if guest.running:
        out.update(
            {
                "balloon": guest.memory_mib() * MIB,
                "diskread": usage["diskread"],
                "diskwrite": usage["diskwrite"],
                "freemem": guest.memory_mib() * MIB - usage["mem"],
                "nics": {
                    f"tap{guest.vmid}i0": {"netin": usage["netin"], "netout": usage["netout"]}
                },
                "pid": guest.pid,
                "pressurecpufull": 0,
                "pressurecpusome": 0.12,
                "pressureiofull": 0,
                "pressureiosome": 0,
                "pressurememoryfull": 0,
                "pressurememorysome": 0,
                "running-machine": "pc-i440fx-10.1+pve0",
                "running-qemu": "10.1.2",
            }
        )
    return out


@handler("GET /nodes/{node}/qemu/{vmid}/status/current")
def vm_status(ctx: Ctx) -> dict[str, Any]:
    return status_current(ctx, ctx.guest())


# --- power ---------------------------------------------------------------------------------


def _task_guest(ctx: Ctx, missing: str = "config") -> Guest:
    """The guest as the worker loads it; a vanished guest fails the task."""
    guest = _lookup(ctx)
    if guest is None:
        if missing == "config":
            raise TaskError(config_missing(ctx.node_name, ctx.vmid).message)
        raise TaskError(_not_found_on_node(ctx).message)
    return guest


def _ha_managed(ctx: Ctx) -> bool:
    guest = ctx.cluster.guests.get(ctx.vmid)
    return guest is not None and guest.ha_state is not None


@handler("POST /nodes/{node}/qemu/{vmid}/status/start")
def vm_start(ctx: Ctx) -> str:
    """Every check is in the task (``vm_start``), in this order: config, template, lock
    (``suspended`` resumes from disk), already running; then pending changes are applied."""
    _root_only(ctx, "skiplock", "migratedfrom", "stateuri", "targetstorage", "force-cpu")
    ha = _ha_managed(ctx)

    def run(task: Task, at: float) -> Any:
        guest = _task_guest(ctx)
        holder = guest.lock_holder
        if holder is not None and holder.is_running and holder is not task:
            raise WaitFor(
                holder,
                LOCK_TIMEOUT,
                f"can't lock file '/var/lock/qemu-server/lock-{guest.vmid}.conf' - got timeout",
            )
        if guest.is_template:
            raise TaskError("you can't start a vm if it's a template")
        lock = guest.lock
        if lock == "backup" and guest.running:
            guest.qmpstatus = "running"
            return None
        if lock and lock != "suspended":
            raise TaskError(f"VM is locked ({lock})")
        if guest.running:
            raise TaskError(f"VM {guest.vmid} already running")
        check_media(ctx.cluster, guest)

        def finish(end: float) -> None:
            if guest.running:
                raise TaskError(f"VM {guest.vmid} already running")
            resuming = guest.lock == "suspended"
            if resuming:
                guest.config.pop("lock", None)
                guest.config.pop("vmstate", None)
                guest.changed()
            launch(ctx.cluster, guest, end, apply=not resuming)
            if ha:
                guest.ha_state = "started"

        return finish

    return ctx.submit("hastart" if ha else "qmstart", str(ctx.vmid), run).upid


def _stop_run(ctx: Ctx, *, shutdown: bool) -> Any:
    force = ctx.flag("forceStop")
    ha = _ha_managed(ctx)

    def run(task: Task, at: float) -> Any:
        guest = _task_guest(ctx, missing="node")
        if not guest.running:
            return None  # stopping a stopped VM is a successful no-op (§3.2)
        lock = guest.lock
        if lock and lock != "suspended":
            raise TaskError(f"VM is locked ({lock})")
        if shutdown and guest.paused and force:
            task.warn("VM is paused - stop instead of shutdown")

        def finish(end: float) -> None:
            power_off(guest)
            if ha:
                guest.ha_state = "stopped"

        return finish

    return run


@handler("POST /nodes/{node}/qemu/{vmid}/status/stop")
def vm_stop(ctx: Ctx) -> str:
    _root_only(ctx, "skiplock", "keepActive", "migratedfrom")
    task_type = "hastop" if _ha_managed(ctx) else "qmstop"
    return ctx.submit(task_type, str(ctx.vmid), _stop_run(ctx, shutdown=False)).upid


@handler("POST /nodes/{node}/qemu/{vmid}/status/shutdown")
def vm_shutdown(ctx: Ctx) -> str:
    """A paused VM without ``forceStop`` is refused synchronously (§3.2)."""
    _root_only(ctx, "skiplock", "keepActive")
    guest = _lookup(ctx)
    if guest is not None and guest.paused and not ctx.flag("forceStop"):
        raise SimError(500, "VM is paused - cannot shutdown")
    task_type = "hastop" if _ha_managed(ctx) else "qmshutdown"
    return ctx.submit(task_type, str(ctx.vmid), _stop_run(ctx, shutdown=True)).upid


def _running_guest(ctx: Ctx) -> Guest:
    """``check_running`` before forking: missing or stopped VMs are refused synchronously."""
    guest = _lookup(ctx)
    if guest is None:
        raise _not_found_on_node(ctx)
    if not guest.running:
        raise SimError(500, f"VM {ctx.vmid} not running")
    return guest


@handler("POST /nodes/{node}/qemu/{vmid}/status/reboot")
def vm_reboot(ctx: Ctx) -> str:
    """Sync: stopped → ``VM <vmid> not running``, paused → ``VM is paused - cannot shutdown``.
    The restart goes through ``vm_start``, so pending changes are applied (§7.16)."""
    guest = _running_guest(ctx)
    if guest.paused:
        raise SimError(500, "VM is paused - cannot shutdown")

    def run(task: Task, at: float) -> Any:
        current = _task_guest(ctx, missing="node")
        if current.lock:
            raise TaskError(f"VM is locked ({current.lock})")

        def finish(end: float) -> None:
            if current.running:
                restart(ctx.cluster, current, end)

        return finish

    return ctx.submit("qmreboot", str(ctx.vmid), run).upid


@handler("POST /nodes/{node}/qemu/{vmid}/status/reset")
def vm_reset(ctx: Ctx) -> str:
    _root_only(ctx, "skiplock")
    _running_guest(ctx)

    def run(task: Task, at: float) -> Any:
        guest = _task_guest(ctx, missing="node")
        if guest.lock:
            raise TaskError(f"VM is locked ({guest.lock})")

        def finish(end: float) -> None:
            if guest.running:
                guest.booted_at = end
                guest.qmpstatus = "running"

        return finish

    return ctx.submit("qmreset", str(ctx.vmid), run).upid


@handler("POST /nodes/{node}/qemu/{vmid}/status/suspend")
def vm_suspend(ctx: Ctx) -> str:
    """To RAM (``qmpause``: QMP ``paused``) or to disk (``qmsuspend``: stopped, ``suspended``)."""
    _root_only(ctx, "skiplock")
    _running_guest(ctx)
    todisk = ctx.flag("todisk")

    def run(task: Task, at: float) -> Any:
        guest = _task_guest(ctx, missing="node")
        if guest.lock:
            raise TaskError(f"VM is locked ({guest.lock})")

        def finish(end: float) -> None:
            if todisk:
                hibernate(ctx, guest)
            else:
                guest.qmpstatus = "paused"

        return finish

    return ctx.submit("qmsuspend" if todisk else "qmpause", str(ctx.vmid), run).upid


def hibernate(ctx: Ctx, guest: Guest) -> None:
    guest.config["lock"] = "suspended"
    guest.config["vmstate"] = f"local-lvm:vm-{guest.vmid}-state-suspend-2026-01-01"
    guest.changed()
    power_off(guest)


@handler("POST /nodes/{node}/qemu/{vmid}/status/resume")
def vm_resume(ctx: Ctx) -> str:
    _root_only(ctx, "skiplock")
    guest = _lookup(ctx)
    if guest is None:
        raise _not_found_on_node(ctx)
    from_disk = guest.lock == "suspended"
    if not from_disk and not guest.running:
        raise SimError(500, f"VM {ctx.vmid} not running")

    def run(task: Task, at: float) -> Any:
        current = _task_guest(ctx, missing="node")

        def finish(end: float) -> None:
            if from_disk:
                current.config.pop("lock", None)
                current.config.pop("vmstate", None)
                current.changed()
                launch(ctx.cluster, current, end, apply=False)
            else:
                current.qmpstatus = "running"

        return finish

    return ctx.submit("qmresume", str(ctx.vmid), run).upid


# --- destroy -------------------------------------------------------------------------------


@handler("DELETE /nodes/{node}/qemu/{vmid}")
def vm_destroy(ctx: Ctx) -> str:
    """Sync: config, protection, HA without ``purge``, running. Task: lock (``suspended`` is
    ignored), volumes freed, and only at the end is the VMID free again (§7.18)."""
    guest = ctx.guest()
    _root_only(ctx, "skiplock")
    vmid = ctx.vmid
    purge = ctx.flag("purge")
    if str(guest.config.get("protection", 0)) == "1":
        raise SimError(500, f"can't remove VM {vmid} - protection mode enabled")
    if guest.ha_state is not None and not purge:
        raise SimError(
            500, f"unable to remove VM {vmid} - used in HA resources and purge parameter not set."
        )
    if guest.running:
        raise SimError(500, f"VM {vmid} is running - destroy failed")
    unreferenced = ctx.flag("destroy-unreferenced-disks")

    def run(task: Task, at: float) -> Any:
        current = _task_guest(ctx)
        if current.lock and current.lock != "suspended":
            raise TaskError(f"VM is locked ({current.lock})")
        if current.running:
            raise TaskError(f"VM {vmid} is running - destroy failed")

        def finish(end: float) -> None:
            cluster = ctx.cluster
            volumes = owned_volumes(cluster, current)
            for storage, volume in volumes:
                volid = storage.volid(volume.volname)
                if any(v.parent == volume.volname for v in storage.volumes.values()):
                    raise TaskError(f"base volume '{volid}' is still in use by linked cloned")
            for storage, volume in volumes:
                storage.volumes.pop(volume.volname, None)
            if unreferenced:
                for storage in cluster.nodes[current.node].storages.values():
                    for name, volume in list(storage.volumes.items()):
                        if volume.vmid == vmid and volume.content == "images":
                            del storage.volumes[name]
            if purge:
                current.ha_state = None
            cluster.remove_guest(vmid)

        return finish

    return ctx.submit("qmdestroy", str(vmid), run).upid


# --- config writes -------------------------------------------------------------------------


@handler("PUT /nodes/{node}/qemu/{vmid}/config")
def vm_config_put(ctx: Ctx) -> None:
    """Synchronous: every change is written (and applied as far as it can be) before null."""
    update = ConfigUpdate(
        ctx.cluster, ctx.vmid, ctx.params, ctx.perms, ctime=ctx.cluster.wall(ctx.now)
    )
    guest = ctx.guest()
    update.check_config(guest)
    update.write(guest)


@handler("POST /nodes/{node}/qemu/{vmid}/config")
def vm_config_post(ctx: Ctx) -> Reply:
    """The same checks synchronously, the write in a ``qmconfig`` task (§4.6)."""
    update = ConfigUpdate(
        ctx.cluster, ctx.vmid, ctx.params, ctx.perms, ctime=ctx.cluster.wall(ctx.now)
    )
    guest = ctx.guest()
    update.check_config(guest)

    def run(task: Task, at: float) -> Any:
        current = _task_guest(ctx)
        try:
            update.check_config(current)
            update.write(current)
        except SimError as exc:
            detail = "; ".join(f"{k}: {v}" for k, v in (exc.errors or {}).items())
            raise TaskError(detail or exc.message) from None
        return None

    task = ctx.submit("qmconfig", str(ctx.vmid), run)
    delay = ctx.integer("background_delay")
    if delay:
        return ctx.wait_for(
            task, delay, lambda status: SimError(500, f"failed to update VM {ctx.vmid}: {status}")
        )
    return Reply(task.upid)
