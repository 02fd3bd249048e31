"""Power and replace confirmations bound to the VMs' config digests (seed 001, issue 14).

Seed 001: "Configuration digests are additional confirmation conditions." The confirmation page
shows each target's config digest and posts it back signed; a VM whose config changed in
Proxmox between the page and the confirm, or between the confirm and the worker's mutation, is
refused with what to do, and the simulator's ledger shows no lifecycle call and no destroy. An
unchanged VM is acted on as before.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pump import Pump, Sim
from test_admin_support import (
    PROXY_LIST,
    People,
    changelist_post,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
    running,
)

from provisioning.models import Operation, Proxy
from provisioning.models.choices import DriftPolicy, OperationKind, OperationState, Phase
from provisioning.services import shown_digests
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db

SHUTDOWN = "POST /nodes/{node}/qemu/{vmid}/status/shutdown"
STOP = "POST /nodes/{node}/qemu/{vmid}/status/stop"
DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
CHANGED = "the VM's config changed since it was shown"


def _digest(sim: Sim, proxy: Proxy) -> str:
    return sim.api.vm_config(proxy.node, proxy.vmid)["digest"]


def _edit_behind_our_back(sim: Sim, proxy: Proxy) -> None:
    """Someone edits the VM in Proxmox: a tag, applied at once even on a running VM."""
    before = _digest(sim, proxy)
    sim.api.set_vm_config(proxy.node, proxy.vmid, {"tags": "edited-by-hand"})
    assert _digest(sim, proxy) != before


def _page(client: Any, action: str, proxies: list[Proxy]) -> tuple[str, str]:
    page = client.post(PROXY_LIST, changelist_post(action, proxies))
    assert page.status_code == 200
    text = page.content.decode()
    found = re.search(r'name="shown_digests" value="([^"]+)"', text)
    assert found, "the page carries the digests it showed"
    return text, found.group(1)


def _confirm(client: Any, action: str, proxies: list[Proxy], token: str) -> Any:
    with posting():
        return client.post(
            PROXY_LIST,
            changelist_post(action, proxies, post="yes", shown_digests=token),
        )


def _confirmed(pump: Pump, sim: Sim, people: People, action: str) -> Proxy:
    """A Running proxy whose ``action`` was confirmed on its page; the worker has not run."""
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    _, token = _page(client, action, [alpha])
    _confirm(client, action, [alpha], token)
    return alpha


def _lifecycle_calls(sim: Sim, key: str) -> int:
    return len(sim.engine.ledger.mutations(key=key))


# --- power -----------------------------------------------------------------------------------


def test_an_unchanged_vm_is_shut_down_and_its_digest_recorded(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    digest = _digest(sim, alpha)
    client = people.client("operator")
    text, token = _page(client, "shutdown", [alpha])
    assert digest[:12] in text
    alpha.refresh_from_db()
    assert alpha.config_digest == digest  # the last digest the service saw
    done = _confirm(client, "shutdown", [alpha], token)
    assert messages_of(done) == ["Shutting down 1 proxy: alpha."]
    op = Operation.objects.get(kind=OperationKind.SHUTDOWN)
    assert op.progress["expected_digest"] == digest
    pump.run()
    alpha.refresh_from_db()
    assert alpha.phase == Phase.STOPPED
    assert _lifecycle_calls(sim, SHUTDOWN) == 1


def test_a_config_changed_between_the_page_and_the_confirm_is_not_sent(
    pump: Pump, sim: Sim, people: People
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    _, token = _page(client, "shutdown", [alpha])
    _edit_behind_our_back(sim, alpha)
    done = _confirm(client, "shutdown", [alpha], token)
    (message,) = messages_of(done)
    assert message.startswith("1 proxy was skipped: alpha: refused: VM")
    assert CHANGED in message and "review and confirm again" in message
    assert not Operation.objects.filter(kind=OperationKind.SHUTDOWN).exists()
    pump.run()
    assert _lifecycle_calls(sim, SHUTDOWN) == 0


def test_a_config_changed_before_the_worker_runs_is_refused_by_it(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha = _confirmed(pump, sim, people, "shutdown")
    _edit_behind_our_back(sim, alpha)
    pump.run()
    op = Operation.objects.get(kind=OperationKind.SHUTDOWN)
    assert op.state == OperationState.FAILED
    assert CHANGED in op.last_error and "review and confirm again" in op.last_error
    assert _lifecycle_calls(sim, SHUTDOWN) == 0
    alpha.refresh_from_db()
    assert alpha.phase != Phase.STOPPED


def test_a_config_changed_between_the_intent_and_the_dispatch_is_refused(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha = _confirmed(pump, sim, people, "shutdown")
    # The intent's read of the node's tasks is the last call before the dispatch's own
    # judgement: the edit lands in between.
    sim.before("GET /nodes/{node}/tasks", lambda call: _edit_behind_our_back(sim, alpha))
    pump.run()
    op = Operation.objects.get(kind=OperationKind.SHUTDOWN)
    assert op.state == OperationState.FAILED and CHANGED in op.last_error
    assert _lifecycle_calls(sim, SHUTDOWN) == 0


def test_forged_or_foreign_digests_send_nothing(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    client = people.client("operator")
    _, start_token = _page(client, "start", [alpha])
    done = _confirm(client, "shutdown", [alpha], start_token)
    assert messages_of(done)[-1] == (
        "Nothing was sent: the digests shown were altered or made for another action"
    )
    forged = shown_digests.sign_digests(
        {alpha.pk: "0" * 40}, action="shutdown", user_id=people.superuser.pk
    )
    done = _confirm(client, "shutdown", [alpha], forged)
    assert messages_of(done)[-1] == (
        "Nothing was sent: the confirmation page was made for another user"
    )
    done = _confirm(client, "shutdown", [alpha], start_token[:-3] + "xyz")
    assert "altered" in messages_of(done)[-1]
    assert not Operation.objects.filter(kind=OperationKind.SHUTDOWN).exists()
    pump.run()
    assert _lifecycle_calls(sim, SHUTDOWN) == 0


# --- replace ---------------------------------------------------------------------------------


def test_an_unchanged_vm_is_replaced(pump: Pump, sim: Sim, people: People) -> None:
    (alpha,) = running(pump, sim, "alpha")
    digest = _digest(sim, alpha)
    client = people.client("operator")
    text, token = _page(client, "replace", [alpha])
    assert digest[:12] in text
    done = _confirm(client, "replace", [alpha], token)
    assert messages_of(done) == ["Replacing the VM of 1 proxy: alpha."]
    assert Operation.objects.get(kind=OperationKind.REPLACE).progress["expected_digest"] == digest
    pump.run()
    alpha.refresh_from_db()
    assert alpha.phase == Phase.RUNNING
    assert sim.engine.ledger.count("DELETE", DESTROY) == 1
    # The old VM's digest is never offered for the new one.
    assert alpha.config_digest != digest


def test_a_config_changed_before_the_replace_runs_keeps_the_vm(
    pump: Pump, sim: Sim, people: People
) -> None:
    alpha = _confirmed(pump, sim, people, "replace")
    old_vmid = alpha.vmid
    _edit_behind_our_back(sim, alpha)
    pump.run()
    op = Operation.objects.get(kind=OperationKind.REPLACE)
    assert op.state == OperationState.FAILED
    assert CHANGED in op.last_error and "review and confirm again" in op.last_error
    assert _lifecycle_calls(sim, STOP) == 0 and _lifecycle_calls(sim, SHUTDOWN) == 0
    assert sim.engine.ledger.count("DELETE", DESTROY) == 0
    assert sim.engine.control.vm(old_vmid)["status"] == "running"


# --- the stored digest is never stale after our own writes --------------------------------------


def test_a_drift_read_refreshes_the_digest_and_a_repair_blanks_it(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    (alpha,) = running(pump, sim, "alpha")
    sim.cluster.drift_policy = DriftPolicy.REPAIR
    sim.cluster.save()
    settings.PROXYHUB_DRIFT_RECHECK_SECONDS = 0  # every converged proxy is read each round
    sim.api.set_vm_config(alpha.node, alpha.vmid, {"memory": "2048"})
    drifted = _digest(sim, alpha)
    assert pump.call(reconcile_round)["repair"] == 1
    alpha.refresh_from_db()
    assert alpha.config_digest == drifted  # the drift read saw it
    pump.run()
    op = Operation.objects.get(proxy=alpha, kind=OperationKind.REPAIR)
    assert op.state == OperationState.SUCCEEDED, op.last_error
    alpha.refresh_from_db()
    # The repair wrote the config: the digest it had read is no longer the VM's.
    assert _digest(sim, alpha) != drifted
    assert alpha.config_digest == ""
    pump.call(reconcile_round)
    alpha.refresh_from_db()
    assert alpha.config_digest == _digest(sim, alpha)
