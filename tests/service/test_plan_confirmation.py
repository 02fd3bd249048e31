"""Commit only the plan that was shown (issue 14, seed 003): the bulk-create page and
``proxies create --plan-hash/--plan-file``.

Between the preview and the commit the catalogue, placement's inputs or the spec may change;
the commit then refuses naming what changed and writes nothing (no proxy, no operation, no
Proxmox call). An unchanged plan commits and the proxies run where the plan said.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core import signing
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pump import Pump, Sim, proxy_spec
from test_admin_bulk import BULK, CONFIRM, _form, _hidden
from test_admin_support import (
    CLOUD_INIT,
    PROXY_LIST,
    People,
    messages_of,
    people_fixture,  # noqa: F401
    posting,
)

from provisioning.models import MachineType, Operation, Proxy, Template
from provisioning.models.choices import RequestedVia
from provisioning.proxmox.plan_set import plan_set_hash
from provisioning.services import operations, plan_confirmation

pytestmark = pytest.mark.django_db

PLACEMENT = ["--cluster", "pvesim", "--machine-type", "small", "--image", "debian-13"]


def _nothing_written(sim: Sim, proxies: int = 0) -> None:
    assert Proxy.objects.count() == proxies
    assert Operation.objects.count() == proxies
    assert sim.engine.ledger.mutations() == []


def _preview(people: People, sim: Sim, **overrides: Any) -> tuple[Any, dict[str, str]]:
    client = people.client("operator")
    page = client.post(BULK, _form(sim, **overrides))
    assert page.status_code == 200
    return client, _hidden(page.content.decode())


def _refused(client: Any, hidden: dict[str, str]) -> str:
    with posting():
        done = client.post(CONFIRM, hidden)
    assert done.status_code == 302 and done["Location"] == BULK
    # The client follows no redirect, so earlier messages are still queued: the last is ours.
    message = messages_of(done)[-1]
    assert message.startswith("Nothing was created")
    return message


# --- the bulk page ------------------------------------------------------------------------


def test_an_unchanged_plan_commits_and_the_proxies_land_where_it_said(
    pump: Pump, sim: Sim, people: People
) -> None:
    client = people.client("operator")
    page = client.post(BULK, _form(sim))
    text = page.content.decode()
    hidden = _hidden(text)
    assert f'id="bulk-plan-hash">{hidden["plan_hash"]}<' in text
    assert "pve1: 1, pve2: 1, pve3: 1" in text
    shown = plan_confirmation.load_shown(hidden["plan_shown"], user_id=people.operator.pk)
    assert plan_set_hash(shown) == hidden["plan_hash"]
    planned = {p["name"]: p["node"] for p in shown["proxies"]}
    assert CLOUD_INIT not in json.dumps(shown)
    with posting():
        done = client.post(CONFIRM, hidden)
    assert done.status_code == 302 and done["Location"] == PROXY_LIST
    assert messages_of(done) == ["Creating 3 proxies: web-1, web-2, web-3."]
    pump.run()
    assert {p.name: p.node for p in Proxy.objects.all()} == planned
    assert set(Proxy.objects.values_list("phase", flat=True)) == {"Running"}


def test_a_catalogue_change_since_the_preview_is_refused_naming_it(
    sim: Sim, people: People
) -> None:
    client, hidden = _preview(people, sim)
    MachineType.objects.filter(cluster=sim.cluster, key="small").update(memory_mib=2048)
    message = _refused(client, hidden)
    assert "machine type small: memory 1024 MiB → 2048 MiB" in message
    assert "review the new plan and confirm again" in message
    _nothing_written(sim)


def test_a_template_copy_added_since_the_preview_is_refused_naming_it(
    sim: Sim, people: People
) -> None:
    client, hidden = _preview(people, sim, zone="pve2")
    Template.objects.filter(cluster=sim.cluster, key="debian-13").update(vmid=9100)
    message = _refused(client, hidden)
    assert "template debian-13 on pve2: VM 9000 → VM 9100" in message
    _nothing_written(sim)


def test_a_placement_change_since_the_preview_is_refused_naming_it(
    pump: Pump, sim: Sim, people: People
) -> None:
    client, hidden = _preview(people, sim)
    # Someone else's proxy is created on pve1 meanwhile: placement would spread the batch
    # differently now.
    _created_elsewhere(pump, sim, "elsewhere", "pve1")
    message = _refused(client, hidden)
    assert "placement inputs on pve1: proxies 0 → 1" in message
    assert "placement: pve1 → pve2 for web-1" in message
    assert Proxy.objects.count() == 1 and not Proxy.objects.filter(name__startswith="web").exists()


def _created_elsewhere(pump: Pump, sim: Sim, name: str, node: str) -> None:
    with posting():
        operations.proxy_create(spec=proxy_spec(sim, name, zone=node), via=RequestedVia.COMMAND)
    pump.run()
    assert Proxy.objects.get(name=name).node == node


def test_a_spec_changed_in_the_posted_form_is_refused_naming_it(sim: Sim, people: People) -> None:
    client, hidden = _preview(people, sim, zone="pve1")
    message = _refused(client, {**hidden, "image": "debian-13-noagent"})
    assert "image: debian-13 → debian-13-noagent for web-1, web-2, web-3" in message
    _nothing_written(sim)


def test_a_forged_shown_plan_is_refused(sim: Sim, people: People) -> None:
    client, hidden = _preview(people, sim, zone="pve1")
    shown = plan_confirmation.load_shown(hidden["plan_shown"], user_id=people.operator.pk)
    # The catalogue changes, and a forged form claims it was shown the new plan: signed with
    # another key, or the real signature over another user's page, or the hash alone swapped.
    MachineType.objects.filter(cluster=sim.cluster, key="small").update(cores=4)
    specs = [
        proxy_spec(sim, f"web-{i}", zone="pve1", cloud_init=CLOUD_INIT.encode()) for i in (1, 2, 3)
    ]
    new = plan_confirmation.plan_set_for(specs)
    forged = signing.dumps(
        {"u": people.operator.pk, "d": new.document},
        key="not-the-server-key",
        salt=plan_confirmation.SHOWN_SALT,
        compress=True,
    )
    message = _refused(client, {**hidden, "plan_shown": forged, "plan_hash": new.plan_hash})
    assert "the shown plan was altered or made for something else" in message
    other_user = plan_confirmation.sign_shown(new.document, user_id=people.viewer.pk)
    message = _refused(client, {**hidden, "plan_shown": other_user, "plan_hash": new.plan_hash})
    assert "made for another user" in message
    message = _refused(client, {**hidden, "plan_hash": new.plan_hash})
    assert "the shown plan does not hash to the plan hash given" in message
    assert plan_set_hash(shown) == hidden["plan_hash"]
    _nothing_written(sim)


# --- the command --------------------------------------------------------------------------


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("proxies", "create", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _command_refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        _run(*args)
    return str(caught.value)


def _dry_run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], Path]:
    printed = _run(*args, "--dry-run", "--json")
    plan = json.loads(printed)
    path = tmp_path / "plan.json"
    path.write_text(printed)
    return plan, path


def test_dry_run_prints_the_plan_and_its_hash_and_writes_nothing(sim: Sim) -> None:
    args = ("--count", "3", "--prefix", "web", *PLACEMENT)
    plan = json.loads(_run(*args, "--dry-run", "--json"))
    assert len(plan["planHash"]) == 64
    assert [(p["name"], p["node"]["name"]) for p in plan["proxies"]] == [
        ("web-1", "pve1"),
        ("web-2", "pve2"),
        ("web-3", "pve3"),
    ]
    assert plan_set_hash(plan["planSet"]) == plan["planHash"]
    text = _run(*args, "--dry-run")
    assert f"plan hash {plan['planHash']}" in text
    assert "web-2  node pve2 (placement)  template 9000  1 cores 1024 MiB 10 GiB" in text
    _nothing_written(sim)


def test_plan_hash_commits_an_unchanged_plan_with_the_usual_output(sim: Sim) -> None:
    args = ("alpha", "beta", *PLACEMENT)
    plan = json.loads(_run(*args, "--dry-run", "--json"))
    out = _run(*args, "--plan-hash", plan["planHash"])
    assert out.splitlines() == [f"{p.name:<5}  {p.uid}" for p in Proxy.objects.order_by("name")]
    assert [p.name for p in Proxy.objects.order_by("name")] == ["alpha", "beta"]


def test_plan_file_names_a_catalogue_change_and_writes_nothing(sim: Sim, tmp_path: Path) -> None:
    args = ("alpha", *PLACEMENT, "--zone", "pve1")
    plan, path = _dry_run(tmp_path, *args)
    MachineType.objects.filter(cluster=sim.cluster, key="small").update(disk_gib=20)
    message = _command_refused(*args, "--plan-file", str(path))
    assert "nothing was created: the plan changed since it was shown" in message
    assert "machine type small: disk 10 GiB → 20 GiB" in message
    # The hash alone cannot say what changed, only that it did.
    message = _command_refused(*args, "--plan-hash", plan["planHash"])
    assert f"not {plan['planHash']}" in message
    _nothing_written(sim)


def test_plan_file_names_a_placement_and_a_spec_change(
    pump: Pump, sim: Sim, tmp_path: Path
) -> None:
    args = ("--count", "2", "--prefix", "web", *PLACEMENT)
    _, path = _dry_run(tmp_path, *args)
    _created_elsewhere(pump, sim, "busy", "pve1")
    message = _command_refused(*args, "--plan-file", str(path))
    assert "placement: pve1 → pve2 for web-1" in message
    assert "placement: pve2 → pve3 for web-2" in message
    other = ("--count", "2", "--prefix", "web", "--cluster", "pvesim", "--machine-type", "small")
    message = _command_refused(*other, "--image", "debian-13-noagent", "--plan-file", str(path))
    assert "image: debian-13 → debian-13-noagent for web-1, web-2" in message
    assert Proxy.objects.count() == 1


def test_an_edited_plan_file_is_refused(sim: Sim, tmp_path: Path) -> None:
    args = ("alpha", *PLACEMENT, "--zone", "pve1")
    plan, path = _dry_run(tmp_path, *args)
    plan["planSet"]["proxies"][0]["node"] = "pve2"
    path.write_text(json.dumps(plan))
    assert "does not hash to the plan hash" in _command_refused(*args, "--plan-file", str(path))
    assert "64 lower-case" in _command_refused(*args, "--plan-hash", "abc")
    _nothing_written(sim)


# --- placement reads its inputs once -------------------------------------------------------


def test_a_500_proxy_preview_reads_placement_once(sim: Sim) -> None:
    for index, node in enumerate(("pve1", "pve1", "pve2")):
        operations.proxy_create(
            spec=proxy_spec(sim, f"old-{index}", zone=node), via=RequestedVia.COMMAND
        )
        # Their VMs were observed where they were asked for (placement counts observed nodes).
        Proxy.objects.filter(name=f"old-{index}").update(node=node)
    specs = [proxy_spec(sim, f"web-{i:03d}", zone="") for i in range(1, 501)]
    with CaptureQueriesContext(connection) as queries:
        plan_set = plan_confirmation.plan_set_for(specs)
    # The catalogue (nodes, templates and their copies, machine types), the installation,
    # health, counts, creates in flight: a fixed handful, not one per proxy.
    assert len(queries.captured_queries) <= 12, [q["sql"] for q in queries.captured_queries]
    nodes = plan_set.nodes()
    # The batch spreads as its creates will: pve3 (no proxy, nothing in flight) first.
    assert plan_set.plans[0][1].node == "pve3"
    assert sum(nodes.values()) == 500 and max(nodes.values()) - min(nodes.values()) <= 1
    assert Proxy.objects.count() == 3  # the preview wrote nothing
