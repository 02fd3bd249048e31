"""Seed 003's readiness, its cloud-init half (issue 14): a template with ``waitForCloudInit``
makes its proxies Running only once cloud-init's result file says done, read through the guest
agent on the address's wait; errors end the create Failed with a bounded summary and never the
user-data; a result that never comes ends at the address budget, saying what to check. Without
the flag nothing changes and the file is never read. Counts come from the simulator's ledger.
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, Proxy, Template
from provisioning.models.choices import OperationState, Phase
from provisioning.proxmox.api import Call
from provisioning.services import operations

pytestmark = pytest.mark.django_db

FILE_READ = "GET /nodes/{node}/qemu/{vmid}/agent/file-read"
INTERFACES = "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"
TEMPLATE = 9000  # debian-13 in the service tests' catalogue; clones inherit its guest


def _wait_for_cloud_init(sim: Sim) -> None:
    Template.objects.filter(cluster=sim.cluster, key="debian-13").update(wait_for_cloud_init=True)
    sim.cluster.save()  # a new updated_at: the providers read the catalogue again


def _create(pump: Pump, sim: Sim, name: str, **kwargs: Any) -> Proxy:
    pump.call(operations.proxy_create, spec=proxy_spec(sim, name, **kwargs))
    pump.run()
    return Proxy.objects.get(name=name)


def test_without_the_flag_the_address_is_enough_and_no_file_is_read(pump: Pump, sim: Sim) -> None:
    sim.engine.control.set_cloud_init(TEMPLATE, outcome="never")
    proxy = _create(pump, sim, "plain")
    assert proxy.phase == Phase.RUNNING and proxy.ip
    assert sim.engine.ledger.calls(key=FILE_READ) == []


def test_running_only_once_the_result_file_says_done(pump: Pump, sim: Sim) -> None:
    _wait_for_cloud_init(sim)
    sim.engine.control.set_cloud_init(TEMPLATE, outcome="done", after=0.3)
    seen: list[tuple[str, str | None, str]] = []

    def phase_at_read(call: Call) -> None:
        row = Proxy.objects.get(name="ready")
        step = Operation.objects.get(proxy=row).steps.order_by("-pk").first()
        seen.append((row.phase, row.ip, step.message if step else ""))

    # What the proxy showed when the second read went out: the first look's outcome.
    sim.before(FILE_READ, lambda call: None)
    sim.before(FILE_READ, phase_at_read)
    proxy = _create(pump, sim, "ready")
    assert proxy.phase == Phase.RUNNING and proxy.ip
    reads = sim.engine.ledger.calls(key=FILE_READ, vmid=proxy.vmid)
    # Looked at until it was there: every read before the last found no file yet.
    assert [r.status for r in reads][-1] == 200
    assert len(reads) >= 2 and {r.status for r in reads[:-1]} == {500}
    assert all(r.params.get("file") == "/run/cloud-init/result.json" for r in reads)
    # While cloud-init ran, the address did not count yet, and the journal said why.
    assert seen == [
        (Phase.PROVISIONING, None, f"waiting for cloud-init to report done (address {proxy.ip})")
    ]
    # One read per look: once the address was known, the agent's interfaces were not read again.
    interfaces = sim.engine.ledger.calls(key=INTERFACES, vmid=proxy.vmid)
    assert max(e.seq for e in interfaces) < reads[0].seq
    op = Operation.objects.get(proxy=proxy)
    assert op.state == OperationState.SUCCEEDED


def test_errors_fail_the_proxy_with_a_summary_and_never_the_user_data(pump: Pump, sim: Sim) -> None:
    _wait_for_cloud_init(sim)
    secret_line = "curl -fsS https://vault.example/v1/token?key=s3cr3t-user-data"
    errors = [f"('scripts_user', RuntimeError('{secret_line} failed'))"] + [
        f"('module_{n}', RuntimeError('{'x' * 400}'))" for n in range(6)
    ]
    sim.engine.control.set_cloud_init(TEMPLATE, outcome="errors", errors=errors)
    user_data = f"#cloud-config\nruncmd:\n  - {secret_line}\n".encode()
    proxy = _create(pump, sim, "broken", cloud_init=user_data)
    assert proxy.phase == Phase.FAILED and proxy.ip is None
    assert "cloud-init reported 7 error(s)" in proxy.last_error
    assert "scripts_user" in proxy.last_error and "[user-data]" in proxy.last_error
    assert "s3cr3t" not in proxy.last_error
    assert "/var/log/cloud-init.log" in proxy.last_error
    assert len(proxy.last_error) < 1200  # seven errors, one of 400 characters each: bounded
    op = Operation.objects.get(proxy=proxy)
    assert op.state == OperationState.FAILED and "s3cr3t" not in op.last_error
    # Failed at the first look that found the file: no further reads.
    reads = sim.engine.ledger.calls(key=FILE_READ, vmid=proxy.vmid)
    assert [r.status for r in reads][-1] == 200
    assert [r.status for r in reads].count(200) == 1


def test_a_result_that_never_comes_ends_at_the_budget_saying_what_to_check(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_ADDRESS_BUDGET_SECONDS = 0.6
    _wait_for_cloud_init(sim)
    sim.engine.control.set_cloud_init(TEMPLATE, outcome="never")
    proxy = _create(pump, sim, "silent")
    assert proxy.phase == Phase.FAILED and proxy.ip is None
    assert "cloud-init did not report done" in proxy.last_error
    assert "/var/log/cloud-init.log" in proxy.last_error
    assert "waitForCloudInit" in proxy.last_error
    reads = sim.engine.ledger.calls(key=FILE_READ, vmid=proxy.vmid)
    assert reads and {r.status for r in reads} == {500}
