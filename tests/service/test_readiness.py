"""Seed 003's readiness rule through the service: a proxy's address is the IPv4 of net0's
interface only. A guest whose agent lists docker0 and tun0 first gets net0's address; one whose
net0 has no IPv4 is never given another interface's, and its create stops waiting at the
address ceiling instead of waiting for ever. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationState, Phase
from provisioning.services import operations

pytestmark = pytest.mark.django_db

DOCKER0 = {
    "name": "docker0",
    "hardware-address": "02:42:ac:11:00:01",
    "ip-addresses": [{"ip-address": "172.17.0.1", "ip-address-type": "ipv4", "prefix": 16}],
}
TUN0 = {
    "name": "tun0",
    "hardware-address": "00:00:00:00:00:00",
    "ip-addresses": [{"ip-address": "10.8.0.1", "ip-address-type": "ipv4", "prefix": 24}],
}
TEMPLATE = 9000  # debian-13 in the service tests' catalogue; clones inherit its guest


def _create(pump: Pump, sim: Sim, name: str) -> Proxy:
    pump.call(operations.proxy_create, spec=proxy_spec(sim, name))
    pump.run()
    return Proxy.objects.get(name=name)


def test_docker_and_tun_listed_first_never_become_the_address(pump: Pump, sim: Sim) -> None:
    sim.engine.control.set_guest_interfaces(TEMPLATE, [DOCKER0, TUN0], first=True)
    proxy = _create(pump, sim, "several")
    assert proxy.phase == Phase.RUNNING
    assert ipaddress.ip_address(str(proxy.ip)) in ipaddress.ip_network("10.20.0.0/16")


def test_net0_without_ipv4_waits_to_the_ceiling_and_takes_no_other_address(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_ADDRESS_BUDGET_SECONDS = 1.0
    sim.engine.control.set_guest_interfaces(TEMPLATE, [DOCKER0, TUN0], first=True, nic_ipv4=False)
    proxy = _create(pump, sim, "v6only")
    assert (proxy.phase, proxy.ip) == (Phase.PROVISIONING, None)
    create = Operation.objects.get(proxy=proxy)
    assert create.state == OperationState.SUCCEEDED
    assert create.steps.filter(message__startswith="no address after").exists()
