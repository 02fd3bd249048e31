"""The cluster the lifecycle tier runs against: the HTTPS simulator, or a real Proxmox VE.

Seed 000 entry 21: the provider's lifecycle is one contract, held by the simulator in
``make test`` and checked against a real cluster with ``make test-real``. With none of the
``PROXMOX_TEST_*`` variables set, the target is the simulator over real TLS and sockets; with
all of them set, it is the cluster they name (docs/operator-guide.md, "Testing against a real
cluster"); with only some, the tier is skipped, naming the ones missing.

Every VM and seed ISO the tier makes carries a name starting with the run's prefix
(``proxy-phtest-<8 hex>``), and the ``cleanup`` fixture removes whatever carries it when the
test ends, passed or failed, so a run that fails halfway leaves nothing behind.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning.proxmox.http import http_api
from tests.http.pvesim_client import SECRET, make_tls_files
from tests.real.leftovers import remove_leftovers
from tests.real.target import ENV, Target, lifecycle_config


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    present = [name for name in ENV if os.environ.get(name)]
    prefix = f"proxy-phtest-{secrets.token_hex(4)}"
    installation = f"phtest-{uuid.uuid4()}"
    if present and len(present) < len(ENV):
        missing = ", ".join(name for name in ENV if name not in present)
        pytest.skip(
            f"the real-cluster tier needs every PROXMOX_TEST_* variable; missing: {missing}"
        )
    if present:
        yield _real(prefix, installation)
        return
    from pvesim.server import SimServer
    from pvesim.simulator import Simulator

    tls = make_tls_files(tmp_path_factory.mktemp("lifecycle-tls"))
    engine = Simulator(profile="fast", token_secret=SECRET)
    server = SimServer(engine, certfile=str(tls.cert), keyfile=str(tls.key)).start()
    token_file = Path(tmp_path_factory.mktemp("lifecycle-token")) / "token"
    token_file.write_text(f"proxyhub@pve!sim={SECRET}\n")
    try:
        config = lifecycle_config(
            url=server.url,
            token_file=str(token_file),
            ca_file=str(tls.ca),
            node="pve1",
            template=9000,
            iso_storage="proxy-seeds",
            installation=installation,
        )
        api = http_api(server.url, str(token_file), ca_file=str(tls.ca))
        yield Target("simulator", api, config, "pve1", 9000, prefix, address_seconds=30.0)
    finally:
        server.stop()


def _real(prefix: str, installation: str) -> Target:
    """The cluster the PROXMOX_TEST_* variables name."""
    env = {name: os.environ[name] for name in ENV}
    node, template = env["PROXMOX_TEST_NODE"], int(env["PROXMOX_TEST_TEMPLATE_VMID"])
    config = lifecycle_config(
        url=env["PROXMOX_TEST_URL"],
        token_file=env["PROXMOX_TEST_TOKEN_FILE"],
        ca_file=env["PROXMOX_TEST_CA_FILE"],
        node=node,
        template=template,
        iso_storage=env["PROXMOX_TEST_ISO_STORAGE"],
        installation=installation,
    )
    api = http_api(config.url, config.token_file, ca_file=config.ca_file)
    return Target("real", api, config, node, template, prefix, address_seconds=600.0)


@pytest.fixture
def cleanup(target: Target) -> Iterator[None]:
    """Whatever this run made is removed when the test ends, however it ended."""
    yield
    remove_leftovers(target.api, target.config, target.prefix)
