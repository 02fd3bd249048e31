"""Fixtures for tests that talk HTTPS to the simulator.

Plain ``requests`` is the client on purpose: these tests check the wire, not proxyhub's client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import requests
from pvesim_client import SECRET, Pve, TLSFiles, make_tls_files

from pvesim.clock import ManualClock
from pvesim.server import Engine as EngineLike
from pvesim.server import SimServer
from pvesim.simulator import Simulator


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def start_server(tls_files: TLSFiles) -> Iterator[Callable[[EngineLike], SimServer]]:
    """Start a ``SimServer`` in front of any engine; every one started is stopped afterwards."""
    started: list[SimServer] = []

    def start(engine: EngineLike) -> SimServer:
        server = SimServer(engine, certfile=str(tls_files.cert), keyfile=str(tls_files.key))
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


def _pve_server(profile: str, tls_files: TLSFiles) -> Iterator[tuple[SimServer, Simulator]]:
    engine = Simulator(profile=profile, clock=ManualClock(), token_secret=SECRET)
    server = SimServer(engine, certfile=str(tls_files.cert), keyfile=str(tls_files.key))
    server.start()
    yield server, engine
    server.stop()


@pytest.fixture(scope="session")
def instant_server(tls_files: TLSFiles) -> Iterator[tuple[SimServer, Simulator]]:
    yield from _pve_server("instant", tls_files)


@pytest.fixture(scope="session")
def fast_server(tls_files: TLSFiles) -> Iterator[tuple[SimServer, Simulator]]:
    yield from _pve_server("fast", tls_files)


def _client(pair: tuple[SimServer, Simulator], tls_files: TLSFiles) -> Iterator[Pve]:
    server, engine = pair
    with requests.Session() as session:
        pve = Pve(server, engine, str(tls_files.ca), session)
        pve.control("reset")  # every test starts from the default cluster
        yield pve


@pytest.fixture
def pve(instant_server: tuple[SimServer, Simulator], tls_files: TLSFiles) -> Iterator[Pve]:
    """The default cluster over HTTPS, every task done the moment it is submitted."""
    yield from _client(instant_server, tls_files)


@pytest.fixture
def pve_timed(fast_server: tuple[SimServer, Simulator], tls_files: TLSFiles) -> Iterator[Pve]:
    """The ``fast`` profile on a manual clock: tasks take time that only the test moves."""
    yield from _client(fast_server, tls_files)
