"""The integration tier's stack: real processes wired the way a team deployment wires them.

* the HTTPS simulator as a subprocess (``python -m pvesim``), read
  through Proxmox's own API with the token it wrote, and through its ``/_sim`` control surface
  for the ledger (every count in this tier comes from there, never from proxyhub's database);
* a PostgreSQL database of its own (``proxyhub_it_<pid>``), migrated by ``manage.py migrate``;
* a Redis database as the broker, claimed so no other run shares it, emptied before and after;
* ``celery -A proxyhub worker`` processes, each the leader of its own process group so a test
  can SIGKILL a whole worker (parent and pool children) at once, and ``celery -A proxyhub beat``.

Every child gets an environment built from scratch with ``proxyhub.settings.production``, so
it is a production process: DEBUG off, a real secret key, Redis and PostgreSQL from the URLs.
The only departures are timing knobs (short polls, claim and sweeper grace), set in the
environment; ``unset`` gives a child the shipped value of a knob instead.

The benchmarks (``benchmarks/fleet.py``) start the same stack, so this module does not import
pytest and does not import Django.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import requests

from provisioning.proxmox.seed import parse_seed_name
from tests.support import redis_claim

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().with_name("probe.py")
# A key that passes `check --deploy` (50+ characters, no "django-insecure-"); test-only.
SEALING_KEY = "aXQtc2VhbGluZy1rZXktbm90LWEtc2VjcmV0LTAwMDE="
SECRET_KEY = "it-7vQ2mZ9xK4pL8rT1wY6nB3cF5hJ0dG2sA9eU4iO7kM1qW8zX3vN6bR5tC0yH"
METRICS_TOKEN = "it-metrics-token-not-a-secret-5tC0yH3vN6bR"

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
UPLOAD = "POST /nodes/{node}/storage/{storage}/upload"
CONFIG_PUT = "PUT /nodes/{node}/qemu/{vmid}/config"
RESIZE = "PUT /nodes/{node}/qemu/{vmid}/resize"
START = "POST /nodes/{node}/qemu/{vmid}/status/start"
STOP = "POST /nodes/{node}/qemu/{vmid}/status/stop"
SHUTDOWN = "POST /nodes/{node}/qemu/{vmid}/status/shutdown"
DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
VOLUME_DELETE = "DELETE /nodes/{node}/storage/{storage}/content/{volume}"
# Not a Proxmox key: the config write that ejects the seed after boot (issue 11), told apart
# from the configure step's by ``mutations_by_vm`` so each can be counted on its own.
SEED_EJECT = "PUT /nodes/{node}/qemu/{vmid}/config (seed eject)"

CREATE_MUTATIONS = frozenset({CLONE, UPLOAD, CONFIG_PUT, RESIZE, START})
DELETE_MUTATIONS = frozenset({STOP, SHUTDOWN, DESTROY, VOLUME_DELETE})

T = TypeVar("T")


class StackError(RuntimeError):
    """A process of the stack did not come up or misbehaved; the message says where to look."""


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "the condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; never a blind sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)


# --- the simulator ----------------------------------------------------------------------------


@dataclass
class Simulator:
    """The simulator subprocess, spoken to as proxyhub would (token, CA) plus ``/_sim``."""

    url: str
    token_file: Path
    ca_file: Path
    catalogue: Path
    process: subprocess.Popen[bytes]
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def __post_init__(self) -> None:
        token = self.token_file.read_text(encoding="utf-8").strip()
        self.session.headers["Authorization"] = f"PVEAPIToken={token}"

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        # ``verify`` on every call: REQUESTS_CA_BUNDLE in the environment would otherwise win
        # over ``Session.verify`` and the simulator's private CA would not be trusted.
        kwargs.setdefault("timeout", 60)
        return self.session.request(method, url, verify=str(self.ca_file), **kwargs)

    # Proxmox's API -------------------------------------------------------------------------

    def api(self, method: str, path: str, **params: Any) -> Any:
        """One Proxmox API call; returns ``data``. Raises for any error status."""
        url = f"{self.url}/api2/json{path}"
        if method in ("GET", "DELETE"):
            reply = self._request(method, url, params=params)
        else:
            reply = self._request(method, url, data=params)
        if reply.status_code >= 400:
            raise StackError(f"{method} {path}: {reply.status_code} {reply.reason}")
        return reply.json().get("data")

    def upload_iso(self, node: str, storage: str, filename: str, content: bytes) -> str:
        reply = self._request(
            "POST",
            f"{self.url}/api2/json/nodes/{node}/storage/{storage}/upload",
            data={"content": "iso"},
            files={"filename": (filename, content, "application/octet-stream")},
        )
        if reply.status_code >= 400:
            raise StackError(f"upload {filename}: {reply.status_code} {reply.reason}")
        return str(reply.json()["data"])

    def wait_task(self, upid: str, timeout: float = 30.0) -> str:
        """Wait for a task to stop; returns its exit status."""
        node = upid.split(":")[1]
        path = f"/nodes/{node}/tasks/{quote(upid, safe='')}/status"

        def stopped() -> str | None:
            status = self.api("GET", path)
            return str(status.get("exitstatus")) if status.get("status") == "stopped" else None

        return wait_until(stopped, timeout=timeout, interval=0.05, what=f"task {upid}")

    def vms(self) -> list[dict[str, Any]]:
        """Every QEMU guest ``/cluster/resources`` lists (templates included)."""
        return [e for e in self.api("GET", "/cluster/resources", type="vm") if e["type"] == "qemu"]

    def vm_config(self, node: str, vmid: int) -> dict[str, Any]:
        return dict(self.api("GET", f"/nodes/{node}/qemu/{vmid}/config"))

    def nodes(self) -> list[str]:
        return [str(n["node"]) for n in self.api("GET", "/nodes")]

    def seeds(self, storage: str = "proxy-seeds") -> list[tuple[str, str]]:
        """(node, volid) of every ISO on the seed storage of every node."""
        found: list[tuple[str, str]] = []
        for node in self.nodes():
            for item in self.api("GET", f"/nodes/{node}/storage/{storage}/content", content="iso"):
                found.append((node, str(item["volid"])))
        return found

    # The control surface -------------------------------------------------------------------

    def control(self, name: str, **kwargs: Any) -> Any:
        reply = self._request("POST", f"{self.url}/_sim/{name}", json=kwargs)
        reply.raise_for_status()
        return reply.json()["data"]

    def ledger(
        self, *, after: int = 0, method: str | None = None, key: str | None = None
    ) -> list[dict[str, Any]]:
        """Ledger entries with ``seq > after``, optionally of one method and schema key."""
        params = {k: v for k, v in (("method", method), ("key", key)) if v}
        reply = self._request("GET", f"{self.url}/_sim/ledger", params=params)
        reply.raise_for_status()
        return [e for e in reply.json()["data"] if e["seq"] > after]

    def last_seq(self) -> int:
        entries = self.ledger()
        return max((e["seq"] for e in entries), default=0)

    def tasks(self) -> list[dict[str, Any]]:
        """Every task the simulator ran: node, type, submitted, startedAt, endedAt (its clock,
        the ledger's ``time``)."""
        reply = self._request("GET", f"{self.url}/_sim/tasks")
        reply.raise_for_status()
        return list(reply.json()["data"])

    def info(self) -> dict[str, Any]:
        reply = self._request("GET", f"{self.url}/_sim/info")
        reply.raise_for_status()
        return dict(reply.json()["data"])

    def stop(self) -> None:
        _terminate(self.process, signal.SIGTERM, grace=10)
        self.session.close()


def start_simulator(
    workdir: Path,
    *,
    profile: str = "fast",
    time_scale: float = 1.0,
    log: Path,
    extra_args: Sequence[str] = (),
) -> Simulator:
    """Start ``python -m pvesim --port 0`` and read its ready line."""
    workdir.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as errors:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pvesim",
                "--port",
                "0",
                "--profile",
                profile,
                "--time-scale",
                str(time_scale),
                "--workdir",
                str(workdir),
                *extra_args,
            ],
            cwd=REPO,
            env=_base_env(),
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,
        )
    line = _read_line(process, timeout=30)
    if not line:
        _terminate(process, signal.SIGKILL, grace=5)
        raise StackError(f"the simulator printed no ready line; see {log}")
    ready = json.loads(line)
    return Simulator(
        url=ready["url"],
        token_file=Path(ready["tokenFile"]),
        ca_file=Path(ready["caFile"]),
        catalogue=Path(ready["catalogue"]),
        process=process,
    )


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().decode().strip()


# --- PostgreSQL and Redis ---------------------------------------------------------------------


@dataclass
class Services:
    """Where the machine's PostgreSQL and Redis are (PROXYHUB_IT_* variables override).

    Several runs of this tier may share one machine (a developer's and CI's, or two helpers'),
    and two runs on one Redis database would take each other's step messages. So unless
    ``PROXYHUB_IT_REDIS_DB`` names one, a run claims a database of its own
    (``tests/support/redis_claim``), as the service tests that publish for real do.
    """

    pg_admin: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    pg_url_base: str = "postgres://postgres@127.0.0.1:5432"
    redis_base: str = "redis://127.0.0.1:6379"
    redis_db: int | None = None
    candidates: tuple[int, ...] = redis_claim.CANDIDATES

    @classmethod
    def from_env(cls) -> Services:
        base = cls()
        forced = os.environ.get("PROXYHUB_IT_REDIS_DB")
        return cls(
            pg_admin=os.environ.get("PROXYHUB_IT_PG_ADMIN", base.pg_admin),
            pg_url_base=os.environ.get("PROXYHUB_IT_PG_BASE", base.pg_url_base),
            redis_base=os.environ.get("PROXYHUB_IT_REDIS", base.redis_base),
            redis_db=int(forced) if forced else None,
        )

    @property
    def redis_url(self) -> str:
        if self.redis_db is None:
            raise StackError("no Redis database claimed yet (call claim_redis_db)")
        return f"{self.redis_base}/{self.redis_db}"

    def unavailable(self) -> str | None:
        """Why this tier cannot run here, or None when both servers answer."""
        import psycopg
        import redis

        try:
            with psycopg.connect(self.pg_admin, connect_timeout=3):
                pass
        except psycopg.Error as err:
            return f"PostgreSQL is not reachable ({type(err).__name__})"
        try:
            redis.Redis.from_url(f"{self.redis_base}/0", socket_connect_timeout=3).ping()
        except redis.RedisError as err:
            return f"Redis is not reachable ({type(err).__name__})"
        return None

    def claim_redis_db(self) -> int:
        """Claim a Redis database for this process and empty it (tests/support/redis_claim)."""
        candidates = (self.redis_db,) if self.redis_db is not None else self.candidates
        try:
            self.redis_db = redis_claim.claim(
                self.redis_base, candidates, forced=self.redis_db is not None
            )
        except redis_claim.NoFreeDatabase as err:
            raise StackError(f"{err}; set PROXYHUB_IT_REDIS_DB to one to use") from err
        return self.redis_db

    def release_redis_db(self) -> None:
        if self.redis_db is not None:
            redis_claim.release(self.redis_base, self.redis_db)

    def create_database(self, name: str) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.pg_admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"{self.pg_url_base}/{name}"

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.pg_admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# --- processes --------------------------------------------------------------------------------


def _base_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
    }


def _terminate(process: subprocess.Popen[Any], sig: int, *, grace: float) -> None:
    """Signal the process group, wait ``grace`` seconds, then SIGKILL what is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    # Pool children outlive a parent that was killed; the group signal reaches them too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class Worker:
    """One ``celery -A proxyhub worker``: its own process group, its own log."""

    name: str
    concurrency: int
    env: Mapping[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, *, ready_timeout: float = 60.0) -> Worker:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "proxyhub",
                    "worker",
                    "-Q",
                    "provisioning,health,control",
                    "--concurrency",
                    str(self.concurrency),
                    "--pool",
                    "prefork",
                    "--loglevel",
                    "INFO",
                    "-n",
                    f"{self.name}@%h",
                ],
                cwd=REPO,
                env=dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches the pool too
            )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise StackError(f"worker {self.name} exited at start; see {self.log}")
            with open(self.log, "rb") as fh:
                fh.seek(offset)
                return b" ready." in fh.read()

        wait_until(ready, timeout=ready_timeout, what=f"worker {self.name} ready")
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole worker: parent and every pool process, with no warning."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), as an operator's restart does."""
        if self.process is not None:
            _terminate(self.process, signal.SIGTERM, grace=15)


@dataclass
class Beat:
    """``celery -A proxyhub beat`` with the database scheduler the migration filled."""

    env: Mapping[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Beat:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "proxyhub", "beat", "--loglevel", "INFO"],
                cwd=REPO,
                env=dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def stop(self) -> None:
        if self.process is not None:
            _terminate(self.process, signal.SIGTERM, grace=10)


# --- the whole stack --------------------------------------------------------------------------


@dataclass
class Stack:
    """Simulator, database, broker and the environment every proxyhub process gets."""

    sim: Simulator
    env: dict[str, str]
    logdir: Path
    workers: list[Worker] = field(default_factory=list)
    beats: list[Beat] = field(default_factory=list)

    def child_env(
        self, env: Mapping[str, str] | None = None, unset: Iterable[str] = ()
    ) -> dict[str, str]:
        """The stack's environment plus ``env``, without ``unset`` (a child then sees those
        settings' shipped defaults)."""
        gone = set(unset)
        return {k: v for k, v in {**self.env, **(env or {})}.items() if k not in gone}

    def manage(
        self,
        *args: str,
        timeout: float = 120,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        unset: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``manage.py ARGS`` in a child with the stack's environment (see ``child_env``)."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.child_env(env, unset),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            command = " ".join(args)
            raise StackError(
                f"manage.py {command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def create_proxies(self, *args: str, cluster: str = "pvesim", timeout: float = 120) -> None:
        """``proxies create ARGS`` (names, or ``--count N --prefix P``) of the simulator's one
        machine type and image on ``cluster``: how every integration test asks for a fleet."""
        self.manage(
            "proxies",
            "create",
            *args,
            "--cluster",
            cluster,
            "--machine-type",
            "small",
            "--image",
            "debian-13",
            timeout=timeout,
        )

    def manage_json(self, *args: str, env: Mapping[str, str] | None = None) -> Any:
        """A ``--json`` command's output (commands log to stderr, so stdout is the document)."""
        return json.loads(self.manage(*args, env=env).stdout)

    def settings(self, *names: str, unset: Iterable[str] = ()) -> dict[str, Any]:
        """The values the stack's processes see for these Django settings (environment first,
        then the shipped defaults), read by a child with the stack's environment."""
        code = (
            "import json, sys; from django.conf import settings; "
            f"json.dump({{n: getattr(settings, n) for n in {list(names)!r}}}, sys.stdout)"
        )
        done = self.manage("shell", "--no-imports", "--command", code, unset=unset)
        return dict(json.loads(done.stdout))

    def proxies(self, prefix: str = "") -> list[dict[str, Any]]:
        """``proxies list --json``, only the names starting with ``prefix``."""
        rows = self.manage_json("proxies", "list", "--json")
        return [r for r in rows if str(r["name"]).startswith(prefix)]

    def wait_phase(self, names: Sequence[str], phase: str, timeout: float) -> None:
        """``proxies wait NAME... --phase PHASE``: fails the caller when it does not exit 0."""
        done = self.manage(
            "proxies",
            "wait",
            *names,
            "--phase",
            phase,
            "--timeout",
            str(int(timeout)),
            timeout=timeout + 30,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(
                f"proxies wait --phase {phase} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n"
                f"worker logs in {self.logdir}"
            )

    def probe(self, *args: str, timeout: float = 120) -> Any:
        """Run ``probe.py ARGS`` (a Django script reading the journal) and parse its JSON."""
        done = subprocess.run(
            [sys.executable, str(PROBE), *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise StackError(f"probe {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return json.loads(done.stdout)

    def probe_async(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(PROBE), *args],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def worker(
        self,
        name: str,
        *,
        concurrency: int = 2,
        unset: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Worker:
        env = self.child_env(env, unset=unset)
        worker = Worker(name, concurrency, env, self.logdir / f"worker-{name}.log")
        self.workers.append(worker)
        return worker.start()

    def beat(self, *, unset: Iterable[str] = ()) -> Beat:
        beat = Beat(self.child_env(unset=unset), self.logdir / "beat.log")
        self.beats.append(beat)
        return beat.start()

    def stop_processes(self) -> None:
        for worker in self.workers:
            worker.stop()
        for beat in self.beats:
            beat.stop()
        self.workers.clear()
        self.beats.clear()


def stack_env(
    *,
    database_url: str,
    redis_url: str,
    var_dir: Path,
    settings_module: str = "proxyhub.settings.production",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of every proxyhub process of the stack (DESIGN.md §7, Processes)."""
    env = _base_env()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": settings_module,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "DJANGO_SECRET_KEY": SECRET_KEY,
            "PROXYHUB_SEALING_KEYS": SEALING_KEY,
            "DJANGO_DEBUG": "0",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PROXYHUB_VAR_DIR": str(var_dir),
            "PROMETHEUS_MULTIPROC_DIR": str(var_dir / "metrics"),
            "PROXYHUB_LOG_LEVEL": "INFO",
            # The simulator's token and CA live in pytest's temporary directories.
            "PROXYHUB_CREDENTIALS_DIR": tempfile.gettempdir(),
            # The benchmarks declare fleets of hundreds with one `proxies create --count`.
            "PROXYHUB_MAX_BULK_CREATE": "10000",
            # Production refuses to start without a /metrics token.
            "PROXYHUB_METRICS_TOKEN": METRICS_TOKEN,
        }
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def running_stack(
    root: Path,
    *,
    services: Services,
    database: str,
    profile: str = "fast",
    time_scale: float = 1.0,
    settings_module: str = "proxyhub.settings.production",
    extra_env: Mapping[str, str] | None = None,
    sim_args: Sequence[str] = (),
    nodes: Sequence[str] | None = None,
) -> Iterator[Stack]:
    """Simulator + fresh database + a Redis database of its own, migrated and with the
    simulator's catalogue imported; everything is stopped, dropped and flushed on the way out.

    ``sim_args`` go to ``python -m pvesim`` as they are (``--node-task-limit 3``); ``nodes``
    imports the cluster with only those of the simulator's nodes (a two-node cluster)."""
    logdir = root / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cleanup:
        services.claim_redis_db()
        cleanup.callback(services.release_redis_db)
        database_url = services.create_database(database)
        cleanup.callback(services.drop_database, database)
        sim = start_simulator(
            root / "pvesim",
            profile=profile,
            time_scale=time_scale,
            log=logdir / "pvesim.log",
            extra_args=sim_args,
        )
        cleanup.callback(sim.stop)
        stack = Stack(
            sim=sim,
            env=stack_env(
                database_url=database_url,
                redis_url=services.redis_url,
                var_dir=root / "var",
                settings_module=settings_module,
                extra=extra_env,
            ),
            logdir=logdir,
        )
        cleanup.callback(stack.stop_processes)
        stack.manage("migrate", "--verbosity", "0")
        catalogue = sim.catalogue
        if nodes is not None:
            catalogue = _catalogue_with_nodes(sim.catalogue, nodes, root / "catalogue.yaml")
        stack.manage("import_catalogue", str(catalogue))
        yield stack


def _catalogue_with_nodes(source: Path, nodes: Sequence[str], target: Path) -> Path:
    """The simulator's catalogue with its cluster's ``nodes`` narrowed to ``nodes``."""
    import yaml

    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    unknown = set(nodes) - set(document["nodes"])
    if unknown:
        raise StackError(f"the simulator has no node {sorted(unknown)}")
    document["nodes"] = list(nodes)
    target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return target


# --- reading the ledger -----------------------------------------------------------------------


def vm_names_by_vmid(entries: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """VMID → VM name, from the clone calls in the ledger (``newid`` and ``name``)."""
    return {
        int(e["params"]["newid"]): str(e["params"]["name"])
        for e in entries
        if e["key"] == CLONE and "newid" in e["params"] and "name" in e["params"]
    }


def _seed_vm(filename: str) -> str:
    parsed = parse_seed_name(filename)
    return parsed.vm_name if parsed else filename.removesuffix("-seed.iso")


def mutations_by_vm(entries: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, str]]]:
    """VM name → [(seq, schema key)] of every state-changing call aimed at it, in order.

    A clone is the VM's by its ``name``, an upload or a volume delete by the VM name in the
    seed's file name (``seed.parse_seed_name``), everything else by the VMID in the path.
    Calls that changed nothing (refused, 4xx/5xx) are left out; clones are kept whatever their
    answer, since a clone submitted twice is what these tests look for.
    """
    names = vm_names_by_vmid(entries)
    out: dict[str, list[tuple[int, str]]] = {}
    for e in entries:
        key = e["key"]
        if key == CLONE:
            name = e["params"].get("name")
        elif not e["mutation"]:
            continue
        elif key == UPLOAD:
            name = _seed_vm(
                str((e.get("upload") or {}).get("filename") or e["params"].get("filename"))
            )
        elif key == VOLUME_DELETE:
            volume = str(e["path_params"].get("volume", ""))
            name = _seed_vm(volume.rsplit("/", 1)[-1])
        elif "vmid" in e["path_params"]:
            name = names.get(int(e["path_params"]["vmid"]))
            if key == CONFIG_PUT and set(e["params"]) == {"ide2"}:
                key = SEED_EJECT
        else:
            continue
        if name:
            out.setdefault(str(name), []).append((int(e["seq"]), str(key)))
    return out
