"""Storage endpoints: list, status, content, volume delete, upload, download-url (pve-reference
§7.4-7.8)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from .fetch import FetchFailed, digest, fetch
from .router import Ctx, Reply, handler
from .state import SimError, Storage, TaskError, Volume

# pve-storage ``normalize_content_filename``: directory part dropped, odd characters → ``_``.
_UNSAFE_FILENAME = re.compile(r"[^-a-zA-Z0-9_.]")
# ``$ISO_EXT_RE_0`` and ``$VZTMPL_EXT_RE_1`` (case-insensitive), ``import`` images.
_EXTENSIONS = {
    "iso": re.compile(r"[^/]+\.(iso|img)$", re.IGNORECASE),
    "vztmpl": re.compile(r"[^/]+\.tar\.(gz|xz|zst|bz2)$", re.IGNORECASE),
    "import": re.compile(r"[^/]+\.(ova|ovf|qcow2|raw|vmdk)$", re.IGNORECASE),
}
_SUBDIR = {"iso": "template/iso", "vztmpl": "template/cache", "import": "import"}
_OWNER = re.compile(r"(?:^|/)(?:vm|base)-(\d+)-")


def _storage(ctx: Ctx, storage_id: str | None = None) -> Storage:
    """``storage '<s>' does not exist`` (pve-storage ``storage_config``)."""
    sid = storage_id or ctx.params["storage"]
    storage = ctx.node.storages.get(sid)
    if storage is None:
        raise SimError(500, f"storage '{sid}' does not exist")
    return storage


def _status(storage: Storage) -> dict[str, Any]:
    return {
        "active": 1,
        "avail": storage.avail,
        "content": ",".join(storage.content),
        "enabled": 1,
        "shared": 1 if storage.shared else 0,
        "total": storage.total,
        "type": storage.type,
        "used": storage.used,
    }


def owner_of(volname: str) -> int | None:
    found = _OWNER.findall(volname)
    return int(found[-1]) if found else None


@handler("GET /nodes/{node}/storage")
def storage_list(ctx: Ctx) -> list[dict[str, Any]]:
    wanted_content = set(filter(None, re.split(r"[,;\s]+", ctx.text("content") or "")))
    only = ctx.text("storage")
    out = []
    for storage in ctx.node.storages.values():
        if only and storage.id != only:
            continue
        if wanted_content and not wanted_content & set(storage.content):
            continue
        if not (
            ctx.perms.has(f"/storage/{storage.id}", "Datastore.Audit")
            or ctx.perms.has(f"/storage/{storage.id}", "Datastore.AllocateSpace")
        ):
            continue
        entry = {"storage": storage.id, **_status(storage)}
        entry["used_fraction"] = round(storage.used / storage.total, 6) if storage.total else 0
        out.append(entry)
    return out


@handler("GET /nodes/{node}/storage/{storage}/status")
def storage_status(ctx: Ctx) -> dict[str, Any]:
    """Unknown storage → 400 ``{"storage": "No such storage."}`` (Status.pm ``read_status``)."""
    storage = ctx.node.storages.get(ctx.params["storage"])
    if storage is None:
        raise SimError.params({"storage": "No such storage."})
    return _status(storage)


@handler("GET /nodes/{node}/storage/{storage}/content")
def storage_content(ctx: Ctx) -> list[dict[str, Any]]:
    """Items sorted by ``volid`` case-insensitively; ``content`` and ``vmid`` filters."""
    storage = _storage(ctx)
    content = ctx.text("content")
    vmid = ctx.integer("vmid")
    items = []
    for volname, volume in storage.volumes.items():
        if content and volume.content != content:
            continue
        if vmid is not None and volume.vmid != vmid:
            continue
        item: dict[str, Any] = {
            "content": volume.content,
            "ctime": volume.ctime,
            "format": volume.format,
            "size": volume.size,
            "volid": storage.volid(volname),
        }
        if volume.vmid is not None:
            item["vmid"] = volume.vmid
        if volume.parent:
            item["parent"] = volume.parent
        items.append(item)
    items.sort(key=lambda i: str(i["volid"]).lower())
    return items


@handler("DELETE /nodes/{node}/storage/{storage}/content/{volume}")
def volume_delete(ctx: Ctx) -> Reply:
    """An ``imgdel`` task; a missing volume is still a successful task (seed 000 entry 11)."""
    storage_id = ctx.params.get("storage")
    volume = ctx.params["volume"]
    if ":" in volume:
        sid, volname = volume.split(":", 1)
        if storage_id and sid != storage_id:
            raise SimError.params({"volume": f"storage ID mismatch ({sid} != {storage_id})\n"})
    else:
        if not storage_id:
            raise SimError.params({"volume": "no storage specified - incomplete volume ID"})
        sid, volname = storage_id, volume
    storage = _storage(ctx, sid)
    ctx.perms.require(f"/storage/{sid}", "Datastore.Allocate")
    volid = storage.volid(volname)
    owner = owner_of(volname)
    task_id = f"{owner}@{sid}" if owner is not None else sid

    def run(task: Any, at: float) -> Any:
        def finish(end: float) -> None:
            storage.volumes.pop(volname, None)
            task.write(f"Removed volume '{volid}'")

        return finish

    task = ctx.submit("imgdel", task_id, run)
    delay = ctx.integer("delay")
    if delay:
        return ctx.wait_for(task, delay, lambda status: SimError(500, status))
    return Reply(task.upid)


@handler("POST /nodes/{node}/storage/{storage}/upload")
def upload(ctx: Ctx) -> str:
    """Checks in Status.pm's order, then an ``imgcopy`` task with an empty id (§7.7)."""
    storage = _storage(ctx)
    if storage.path is None:
        raise SimError(500, f"can't upload to storage type '{storage.type}'")
    if ctx.upload is None or not ctx.params.get("tmpfilename"):
        raise SimError(500, "missing temporary file name")
    content = ctx.params["content"]
    filename = _filename(ctx, content)
    if content not in storage.content:
        raise SimError(500, f"storage '{storage.id}' does not support '{content}' content")
    data = ctx.upload[1]
    tmp = ctx.params["tmpfilename"]
    target = f"{storage.path}/{_SUBDIR[content]}/{filename}"
    checksum = ctx.text("checksum")
    algorithm = ctx.text("checksum-algorithm")
    node_name = ctx.node_name
    ctime = ctx.cluster.wall(ctx.now)

    def run(task: Any, at: float) -> Any:
        task.write(f"starting file import from: {tmp}")
        task.write(f"target node: {node_name}")
        task.write(f"target file: {target}")
        task.write(f"file size is: {len(data)}")
        _verify(task, data, algorithm, checksum)
        task.write(f"command: cp -- {tmp} {target}")

        def finish(end: float) -> None:
            # An upload overwrites a file of the same name (seed 000 entry 5, F12).
            _store(storage, content, filename, data, ctime)
            task.write("finished file import successfully")

        return finish

    return ctx.submit("imgcopy", "", run).upid


def _verify(task: Any, data: bytes, algorithm: str | None, checksum: str | None) -> None:
    """The checksum check of the upload and download workers (§3.7's text), case-insensitive."""
    if not (checksum and algorithm):
        return
    calculated = digest(algorithm, data)
    if calculated != checksum.lower():
        raise TaskError(f"checksum mismatch: got '{calculated}' != expect '{checksum}'")
    task.write("calculating checksum...OK, checksum verified")


def _store(storage: Storage, content: str, filename: str, data: bytes, ctime: int) -> None:
    """The file in its content type's place (``local:iso/x.img``, ``local:import/x.qcow2``),
    replacing one of the same name."""
    volname = f"{content}/{filename}"
    storage.volumes[volname] = Volume(
        volname=volname,
        content=content,
        format="iso" if content == "iso" else filename.rsplit(".", 1)[-1],
        size=len(data),
        ctime=ctime,
        data=data,
    )


def _filename(ctx: Ctx, content: str) -> str:
    """``normalize_content_filename`` and the extension rule of the content type (§7.7)."""
    filename = _UNSAFE_FILENAME.sub("_", re.sub(r"^.*[/\\]", "", ctx.params["filename"]))
    if not _EXTENSIONS[content].fullmatch(filename):
        raise SimError.params({"filename": "wrong file extension"})
    return filename


@handler("POST /nodes/{node}/storage/{storage}/download-url")
def download_url(ctx: Ctx) -> str:
    """The node fetches ``url`` itself in a ``download`` task whose id is the escaped file name
    (§7.8, §4.5). Synchronous: the storage exists on the node, is file based and is configured
    for the content type (§3.7 ``storage '<s>' is not configured for content-type '<content>'``),
    the file name fits the content type (400 ``wrong file extension``). In the task: the fetch
    (really, from loopback: ``fetch``), then the checksum as ``download_file_from_url`` checks it,
    failing with §3.7's ``checksum mismatch: got '<actual>' != expect '<expected>'``; then the
    file lands in the content type's directory, replacing one of the same name."""
    storage = _storage(ctx)
    if storage.path is None:
        raise SimError(500, f"can't upload to storage type '{storage.type}'")
    content = ctx.params["content"]
    if content not in storage.content:
        raise SimError(
            500, f"storage '{storage.id}' is not configured for content-type '{content}'"
        )
    filename = _filename(ctx, content)
    url = ctx.params["url"]
    checksum = ctx.text("checksum")
    algorithm = ctx.text("checksum-algorithm")
    target = f"{storage.path}/{_SUBDIR[content]}/{filename}"
    ctime = ctx.cluster.wall(ctx.now)

    def run(task: Any, at: float) -> Any:
        task.write(f"downloading {url} to {target}")
        try:
            data = fetch(url)
        except FetchFailed as err:
            raise TaskError(str(err)) from None
        task.write(f"download of '{url}' to '{target}' finished")
        _verify(task, data, algorithm, checksum)

        def finish(end: float) -> None:
            _store(storage, content, filename, data, ctime)

        return finish

    return ctx.submit("download", quote(filename, safe=""), run).upid
