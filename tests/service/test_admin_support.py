"""Shared fixtures of the admin console tests (``test_admin_*.py``); it holds no test itself.

A test module uses a fixture by importing it (``people_fixture``), as ``conftest.py`` does
with the pump's; the fixture's name stays ``people``.

People: a superuser, an operator (provision, power and check, and view), a viewer (view only)
and a staff member without permissions, as issue 5 lists them. Secrets: a token file, a CA
file and a cloud-init that each hold a canary string, so a test can prove no page shows them.
Requests run their on-commit callbacks (``posting``), so the step messages the services send
land in the pump, as a committed request's would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.messages import get_messages
from django.test import Client, TestCase
from pump import Pump, Sim, proxy_spec

from provisioning.models import Proxy
from provisioning.services import operations
from provisioning.services.operations import ProxySpec

TOKEN_CANARY = "CANARY-TOKEN-7f3c91d2"
CA_CANARY = "CANARY-CA-0b8e44a1"
CLOUD_INIT_CANARY = "CANARY-CLOUDINIT-5d2a9e77"
CANARIES = (TOKEN_CANARY, CA_CANARY, CLOUD_INIT_CANARY)
CLOUD_INIT = f"#cloud-config\nwrite_files:\n  - path: /etc/motd\n    content: {CLOUD_INIT_CANARY}\n"

VIEW = [
    "view_proxy",
    "view_operation",
    "view_cluster",
    "view_node",
    "view_template",
    "view_machinetype",
]
OPERATOR = [*VIEW, "provision_proxy", "power_proxy", "check_proxy"]


def _group(name: str, codenames: list[str]) -> Group:
    group = Group.objects.create(name=name)
    group.permissions.set(
        Permission.objects.filter(content_type__app_label="provisioning", codename__in=codenames)
    )
    return group


@dataclass
class People:
    superuser: Any
    operator: Any
    viewer: Any
    staff: Any

    def client(self, who: str, *, csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(getattr(self, who))
        return client


@pytest.fixture(name="people")
def people_fixture(django_user_model: Any) -> People:
    operators = _group("operators", OPERATOR)
    viewers = _group("viewers", VIEW)

    def user(name: str, **flags: Any) -> Any:
        # No password: clients log in with force_login, and hashing one costs a quarter second.
        return django_user_model.objects.create_user(username=name, is_staff=True, **flags)

    operator = user("olivia")
    operator.groups.add(operators)
    viewer = user("victor")
    viewer.groups.add(viewers)
    return People(
        superuser=user("root", is_superuser=True),
        operator=operator,
        viewer=viewer,
        staff=user("stan"),
    )


@pytest.fixture(name="secret_files")
def secret_files_fixture(sim: Sim, tmp_path: Path) -> Sim:
    """Point the simulator's cluster at a token and a CA file holding canaries. The in-process
    transport never reads them; the pages must not either."""
    token = tmp_path / "token"
    token.write_text(f"root@pam!proxyhub={TOKEN_CANARY}\n")
    ca = tmp_path / "ca.pem"
    ca.write_text(f"-----BEGIN CERTIFICATE-----\n{CA_CANARY}\n-----END CERTIFICATE-----\n")
    sim.cluster.token_file = str(token)
    sim.cluster.ca_file = str(ca)
    sim.cluster.save()
    return sim


@contextmanager
def posting() -> Iterator[None]:
    """Run the request's on-commit callbacks, as a committed request would."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        yield


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def spec(sim: Sim, name: str, **kwargs: Any) -> ProxySpec:
    return proxy_spec(sim, name, **{"cloud_init": CLOUD_INIT.encode(), **kwargs})


def running(pump: Pump, sim: Sim, *names: str, **kwargs: Any) -> list[Proxy]:
    """Proxies created through the service and driven to Running."""
    for name in names:
        pump.call(operations.proxy_create, spec=spec(sim, name, **kwargs))
    pump.run()
    proxies = list(Proxy.objects.filter(name__in=names).order_by("name"))
    assert [p.phase for p in proxies] == ["Running"] * len(names)
    return proxies


def changelist_post(action: str, proxies: list[Proxy], **extra: str) -> dict[str, Any]:
    """The POST the proxy list sends for ``action`` on ``proxies``."""
    return {"action": action, "_selected_action": [str(p.pk) for p in proxies], **extra}


PROXY_LIST = "/admin/provisioning/proxy/"
