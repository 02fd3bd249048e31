"""The embedded broker: kombu's filesystem transport, with files that appear only when whole.

``make run`` and a single-machine install use no broker server: producers (web, Beat, workers)
and consumers (workers) share a folder of message files (settings ``CELERY_BROKER_TRANSPORT``).
kombu 5.7's transport creates each file where readers look and only then writes it, so a worker
polling the folder in between takes an empty file, fails to decode it and stops with
"Unrecoverable error: JSONDecodeError" (celery/kombu#1551). The exchange tables in the control
folder have the same gap when two processes bind at start-up. Here every new file is written
under a name nobody reads and then renamed (a message) or linked (a table) into place, which is
atomic on one filesystem: a reader sees the whole file or none. Everything else is kombu's.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


def _write_whole(target: Path, data: bytes, *, overwrite: bool) -> None:
    """Write ``data`` to ``target`` so that no reader ever sees part of it.

    The bytes go to a sibling named ``<target>.<uuid>.part`` first; kombu's readers match whole
    names (``<queue>.msg``, ``<exchange>.exchange``), so they never pick it up. Without
    ``overwrite`` an existing target raises FileExistsError and is left alone.
    """
    part = target.with_name(f"{target.name}.{uuid.uuid4().hex}.part")
    try:
        with open(part, "xb", buffering=0) as f:
            f.write(data)
        if overwrite:
            os.replace(part, target)
        else:
            os.link(part, target)
    except FileExistsError:
        raise
    except OSError as exc:
        raise ChannelError(f"Cannot add file {str(target)!r} to directory") from exc
    finally:
        part.unlink(missing_ok=True)


class Channel(filesystem.Channel):
    # kombu's abstract channel names the argument ``message``, its filesystem channel
    # ``payload``; this keeps the filesystem channel's, which is the one it replaces.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's own name: readers sort by the leading milliseconds, so order is kept.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        data = str_to_bytes(dumps(payload))
        _write_whole(Path(self.data_folder_out) / name, data, overwrite=True)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(exist_ok=True)
            binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            try:
                _write_whole(table, str_to_bytes(dumps([binding])), overwrite=False)
                return
            except FileExistsError:
                pass  # another process created the table first: add this binding to it
        # The table exists and is whole: kombu's update under its exclusive lock is safe.
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel
