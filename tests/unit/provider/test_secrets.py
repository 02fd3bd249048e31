"""Cloud-init content never leaves the seed ISO (seed 000 entries 10 and 20, DESIGN.md §8)."""

from __future__ import annotations

import json
import logging

import pytest
from provider_world import World

CANARY = "CANARY-cloud-init-5f0c2d7e"
UPLOAD_PATH = "/nodes/{node}/storage/{storage}/upload"
CONFIG_PATH = "/nodes/{node}/qemu/{vmid}/config"


def _everything_logged(records: list[logging.LogRecord]) -> str:
    parts = []
    for record in records:
        parts.append(record.getMessage())
        parts.extend(f"{k}={v!r}" for k, v in vars(record).items())
    return "\n".join(parts)


def test_create_cloud_init_sentinel_never_logged_or_in_errors(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    req = world.request("canary", cloud_init=f"#cloud-config\nwrite_files: [{CANARY}]\n".encode())
    # Fail the upload once and the config write once, so error paths run too.
    world.engine.control.fail_call("POST", UPLOAD_PATH, kind="status", status=500, message="boom")
    world.engine.control.fail_call("PUT", CONFIG_PATH, kind="500")
    errors = []
    progress = world.provider.new_create_progress()
    for _ in range(1000):
        result = world.step(lambda p: world.provider.create_step(req, p), progress)
        progress = result.progress
        if result.status == "error":
            errors.append(str(result.error))
            assert result.error is not None and result.error.kind == "transient"
        if result.status == "done":
            break
    assert result.status == "done" and len(errors) == 2

    assert CANARY not in "\n".join(errors)
    assert CANARY not in _everything_logged(caplog.records)
    assert "cloudInitBytes" in _everything_logged(caplog.records)
    for step in world.results:
        # The record is what proxyhub persists in its journal: it must not carry the content.
        assert CANARY not in json.dumps(step.progress)
        assert CANARY not in step.message
    assert CANARY not in repr(req)
    ledger = json.dumps([e.as_dict() for e in world.engine.ledger.calls()], default=str)
    assert CANARY not in ledger
    # It did reach Proxmox, inside the seed ISO and nowhere else.
    stored = world.engine.control.volume_data("pve1", world.seed_volid(req))
    assert stored is not None and CANARY.encode() in stored
