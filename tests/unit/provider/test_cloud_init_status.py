"""Cloud-init's result file read through the agent (``proxmox/readiness.py``, seed 003's
readiness) over the in-process simulator, and the summary of its errors."""

from __future__ import annotations

import json

import pytest
from provider_world import World

from provisioning.proxmox import readiness
from provisioning.proxmox.errors import PermanentError, TransientError

FILE_READ = "GET /nodes/{node}/qemu/{vmid}/agent/file-read"


def _running(world: World, name: str = "ci") -> tuple[str, int]:
    done = world.create(world.request(name))
    assert done.status == "done", done.error
    return str(done.provider_id), int(str(done.provider_id).split("/")[1])


def test_absent_then_done_one_read_each(world: World) -> None:
    world.engine.control.set_cloud_init(9000, after=5.0)
    provider_id, vmid = _running(world)
    world.engine.control.advance(1.0)  # the agent is up and the address is there (0.6 s)
    before = len(world.engine.ledger.calls(key=FILE_READ))
    first = world.provider.cloud_init_status(provider_id, node="pve1")
    assert first.state == "pending" and "not written" in first.why
    world.engine.control.advance(6.0)
    assert world.provider.cloud_init_status(provider_id, node="pve1").state == "done"
    reads = world.engine.ledger.calls(key=FILE_READ, vmid=vmid)
    assert len(reads) - before == 2


def test_errors_are_failed_with_what_cloud_init_said(world: World) -> None:
    world.engine.control.set_cloud_init(9000, outcome="errors", errors=["a", "b"], after=0)
    provider_id, _ = _running(world)
    world.engine.control.advance(2.0)
    status = world.provider.cloud_init_status(provider_id, node="pve1")
    assert (status.state, status.errors) == ("failed", ("a", "b"))


def test_an_agent_not_answering_is_pending(world: World) -> None:
    provider_id, vmid = _running(world, "paused")
    world.engine.control.pause_vm(vmid)  # QMP stop: Proxmox says the agent is not running
    status = world.provider.cloud_init_status(provider_id, node="pve1")
    assert status.state == "pending" and "agent" in status.why


def test_a_stopped_vm_and_a_missing_privilege_are_raised_classified(world: World) -> None:
    provider_id, vmid = _running(world, "stopme")
    # file-read needs FileRead or Unrestricted (schema): a token with neither is refused.
    world.engine.control.deny("/", "VM.GuestAgent.FileRead")
    world.engine.control.deny("/", "VM.GuestAgent.Unrestricted")
    with pytest.raises(PermanentError) as denied:
        world.provider.cloud_init_status(provider_id, node="pve1")
    assert "Proxmox denied the request" in str(denied.value)
    assert "grant the missing privilege" in denied.value.remediation
    world.engine.control.allow()
    world.api.stop("pve1", vmid)
    world.engine.control.advance(5.0)
    with pytest.raises(TransientError, match=f"VM {vmid} is not running"):
        world.provider.cloud_init_status(provider_id, node="pve1")


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        ({"content": json.dumps({"v1": {"errors": []}})}, "done"),
        ({"content": json.dumps({"v1": {"errors": ["x"]}})}, "failed"),
        ({"content": '{"v1": {"errors": ['}, "pending"),  # caught half-written
        ({"content": json.dumps({"v1": {}})}, "pending"),
        ({"content": "[]"}, "pending"),
        ({"content": json.dumps({"v1": {"errors": []}}), "truncated": 1}, "pending"),
        ({}, "pending"),
    ],
)
def test_parse_result(answer: dict[str, object], state: str) -> None:
    assert readiness.parse_result(answer).state == state


def test_the_summary_is_bounded_and_hides_the_user_data() -> None:
    user_data = b"#cloud-config\nruncmd:\n  - 'echo hunter2-password > /etc/app'\n"
    long_ones = ["y" * 1000 for _ in range(50)]
    errors = ("RuntimeError('echo hunter2-password > /etc/app failed')", *long_ones)
    summary = readiness.summarise(errors, user_data=user_data)
    assert "hunter2" not in summary and "[user-data]" in summary
    assert len(summary) <= readiness.MAX_SUMMARY_CHARS
    assert summary.endswith("; and 48 more")  # 51 errors, three shown
    short = readiness.summarise(("one", "two"), user_data=b"")
    assert short == "one; two"
