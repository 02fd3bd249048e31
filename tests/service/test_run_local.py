"""``make run`` (bin/run-local): the order of the steps, the admin login, and stopping everything.

The script runs here against a stand-in repository: the real ``bin/run-local`` with its
``bin/runlocal/`` modules (copied, since they find the repository from where they are) and the
real simulator (``pvesim`` linked in, and nothing of ``provisioning``), but a ``manage.py`` that
records what it was asked and a ``Procfile.local`` of small stand-in processes. That keeps the
test to seconds and independent of the Django project, while everything the script itself does
(children, signals, files) is real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

FAKE_MANAGE = """\
import json, os, sys
root = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(root, "manage-calls.jsonl"), "a") as fh:
    fh.write(json.dumps({
        "argv": sys.argv[1:],
        "password": os.environ.get("RUN_LOCAL_ADMIN_PASSWORD"),
        "settings": os.environ.get("DJANGO_SETTINGS_MODULE"),
        "redis": os.environ.get("REDIS_URL"),
        "var": os.environ.get("PROXYHUB_VAR_DIR"),
        "credentials": os.environ.get("PROXYHUB_CREDENTIALS_DIR"),
        "sealing": os.environ.get("PROXYHUB_SEALING_KEYS"),
    }) + "\\n")
sys.exit(int(os.environ.get("FAKE_MANAGE_FAIL_" + sys.argv[1], "0")))
"""

# A worker that records the simulator's env and its pid, then idles until it is stopped.
FAKE_WORKER = """\
import json, os, time
env = {k: v for k, v in os.environ.items() if k.startswith("PVESIM_")}
with open("worker-env.json", "w") as fh:
    json.dump(env, fh)
with open("worker.pid", "w") as fh:
    fh.write(str(os.getpid()))
time.sleep(600)
"""

# A web process that listens on WEB_PORT, and the worker above.
FAKE_PROCFILE = """\
web: python -m http.server --bind 127.0.0.1 $WEB_PORT
worker: python fake_worker.py
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    shutil.copy2(REPO / "bin" / "run-local", tmp_path / "bin" / "run-local")
    shutil.copytree(
        REPO / "bin" / "runlocal",
        tmp_path / "bin" / "runlocal",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "pvesim").symlink_to(REPO / "pvesim")
    (tmp_path / "manage.py").write_text(FAKE_MANAGE)
    (tmp_path / "Procfile.local").write_text(FAKE_PROCFILE)
    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    return tmp_path


HOST_SETTINGS = (
    "DJANGO_SETTINGS_MODULE",  # pytest-django exports the test suite's
    "REDIS_URL",
    "DATABASE_URL",
    "DJANGO_DEBUG",
    "PROXYHUB_VAR_DIR",
    "PROMETHEUS_MULTIPROC_DIR",
    "PROXYHUB_CREDENTIALS_DIR",
)


class RunLocal:
    """``bin/run-local`` in its own session, as a terminal would run it for Ctrl-C."""

    def __init__(self, repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.repo = repo
        self.web_port = free_port()
        self.out = (repo / "stdout.txt").open("w+b")
        self.err = (repo / "stderr.txt").open("w+b")
        # The embedded default, whatever the test run's own environment says.
        child_env = {k: v for k, v in os.environ.items() if k not in HOST_SETTINGS}
        child_env.update(env or {})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(repo / "bin" / "run-local"),
                "--web-port",
                str(self.web_port),
                "--sim-profile",
                "instant",
                *args,
            ],
            cwd=repo,
            stdout=self.out,
            stderr=self.err,
            env=child_env,
            start_new_session=True,
        )

    def stdout(self) -> str:
        return (self.repo / "stdout.txt").read_text()

    def stderr(self) -> str:
        return (self.repo / "stderr.txt").read_text()

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_for(
            lambda: "ready:" in self.stderr() or self.proc.poll() is not None, timeout, "ready"
        )
        assert self.proc.poll() is None, self.stderr()

    def manage_calls(self) -> list[dict[str, object]]:
        path = self.repo / "manage-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def sim_port(self) -> int:
        """The simulator's port, from the catalogue it wrote for this run."""
        catalogue = yaml.safe_load((self.repo / "var" / "pvesim" / "catalogue.yaml").read_text())
        return int(urlsplit(catalogue["url"]).port or 0)

    def close(self) -> None:
        """Leave nothing running, even when the test failed half-way."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        worker_pid = self.repo / "worker.pid"
        if worker_pid.exists() and alive(pid := int(worker_pid.read_text())):
            os.kill(pid, signal.SIGKILL)
        self.out.close()
        self.err.close()


@pytest.fixture
def run_local(fake_repo: Path):
    started: list[RunLocal] = []

    def start(*args: str, env: dict[str, str] | None = None) -> RunLocal:
        runner = RunLocal(fake_repo, *args, env=env)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.close()


def test_steps_run_in_order_and_print_the_admin_login(run_local, fake_repo: Path) -> None:
    stale_metrics = fake_repo / "var" / "metrics" / "counter_4242.db"
    stale_metrics.parent.mkdir(parents=True)
    stale_metrics.write_bytes(b"left by an earlier run")
    runner = run_local()
    runner.wait_ready()

    calls = runner.manage_calls()
    commands = [call["argv"][0] for call in calls]
    assert commands == ["migrate", "import_catalogue", "shell"]
    catalogue = fake_repo / "var" / "pvesim" / "catalogue.yaml"
    assert calls[1]["argv"] == ["import_catalogue", str(catalogue)]
    assert "kind: ProxmoxCluster" in catalogue.read_text()

    # The embedded default: development settings for runserver, no Redis, state under var/.
    assert all(
        call["settings"] == "proxyhub.settings.local" and call["redis"] is None for call in calls
    )
    assert all(call["var"] == str(fake_repo / "var") for call in calls)
    # Issue 11: the import and every process may read the simulator's token and CA, and only
    # the simulator's workdir.
    document = yaml.safe_load(catalogue.read_text())
    credentials = {call["credentials"] for call in calls}
    assert credentials == {str(fake_repo / "var" / "pvesim")}
    for key in ("tokenFile", "caFile"):
        assert Path(document[key]).is_relative_to(fake_repo / "var" / "pvesim"), key
    # Metrics files of an earlier run would be added to this run's counters.
    assert not stale_metrics.exists()

    password_file = fake_repo / "var" / "admin-password"
    password = password_file.read_text().strip()
    assert len(password) >= 20
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert calls[2]["password"] == password
    # The password reaches Django through the environment, never the command line.
    assert password not in " ".join(calls[2]["argv"])
    assert (
        f"Admin: http://127.0.0.1:{runner.web_port}/admin/ user admin password {password}"
        in runner.stdout()
    )

    # The Procfile's processes run with the simulator's coordinates.
    wait_for(lambda: (fake_repo / "worker-env.json").exists(), 10, "the worker")
    worker_env = json.loads((fake_repo / "worker-env.json").read_text())
    assert worker_env["PVESIM_CATALOGUE"] == str(catalogue)
    assert worker_env["PVESIM_URL"].startswith("https://127.0.0.1:")
    assert listening(runner.sim_port())


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_everything(run_local, fake_repo: Path, how: str) -> None:
    runner = run_local()
    runner.wait_ready()
    wait_for(lambda: (fake_repo / "worker.pid").exists(), 10, "the worker")
    worker_pid = int((fake_repo / "worker.pid").read_text())
    sim_port = runner.sim_port()
    assert listening(runner.web_port) and listening(sim_port) and alive(worker_pid)

    if how == "ctrl-c":
        # A terminal's Ctrl-C signals the whole foreground process group.
        os.killpg(runner.proc.pid, signal.SIGINT)
    else:
        runner.proc.send_signal(signal.SIGTERM)
    assert runner.proc.wait(30) == 0

    assert not listening(runner.web_port)
    assert not listening(sim_port)
    wait_for(lambda: not alive(worker_pid), 5, "the worker to exit")


def test_admin_password_is_kept_across_runs(run_local, fake_repo: Path) -> None:
    first = run_local()
    first.wait_ready()
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(30) == 0
    password = (fake_repo / "var" / "admin-password").read_text().strip()

    second = run_local()
    second.wait_ready()
    assert f"password {password}" in second.stdout()
    shell_calls = [c for c in second.manage_calls() if c["argv"][0] == "shell"]
    assert [c["password"] for c in shell_calls] == [password, password]


def test_the_sealing_key_is_generated_once_kept_out_of_git_and_reused(
    run_local, fake_repo: Path
) -> None:
    """No constant from the repository seals a clone's cloud-init: the first run makes a random
    Fernet key under var/ (gitignored), owner-only, and every later run hands the same one to
    every process."""
    from cryptography.fernet import Fernet

    first = run_local()
    first.wait_ready()
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(30) == 0
    key_file = fake_repo / "var" / "sealing-key"
    key = key_file.read_text().strip()
    Fernet(key.encode())  # a valid key, or this raises
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert {c["sealing"] for c in first.manage_calls()} == {key}
    assert "generated the key that seals cloud-init" in first.stderr()
    assert "var/" in (REPO / ".gitignore").read_text().split()

    second = run_local()
    second.wait_ready()
    assert {c["sealing"] for c in second.manage_calls()} == {key}
    assert "generated the key" not in second.stderr()


def test_a_process_that_dies_stops_the_rest(run_local, fake_repo: Path) -> None:
    (fake_repo / "Procfile.local").write_text(
        FAKE_PROCFILE + 'beat: python -c "import time; time.sleep(1.5); raise SystemExit(3)"\n'
    )
    runner = run_local()
    runner.wait_ready()
    sim_port = runner.sim_port()
    assert runner.proc.wait(30) != 0
    assert not listening(runner.web_port)
    assert not listening(sim_port)


def test_a_failed_migration_stops_before_anything_starts(run_local, fake_repo: Path) -> None:
    runner = run_local(env={"FAKE_MANAGE_FAIL_migrate": "1"})
    assert runner.proc.wait(30) == 1
    assert "migrating the database failed" in runner.stderr()
    assert [c["argv"][0] for c in runner.manage_calls()] == ["migrate"]
    assert not (fake_repo / "var" / "pvesim" / "catalogue.yaml").exists()
    assert not listening(runner.web_port)


def test_a_failed_import_stops_the_simulator(run_local, fake_repo: Path) -> None:
    runner = run_local(env={"FAKE_MANAGE_FAIL_import_catalogue": "2"})
    assert runner.proc.wait(30) == 1
    assert "importing the catalogue failed" in runner.stderr()
    assert not listening(runner.sim_port())
    assert "Admin:" not in runner.stdout()


def test_a_busy_web_port_is_reported_before_any_step(run_local, fake_repo: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        runner = run_local("--web-port", str(port))
        assert runner.proc.wait(30) == 1
    assert f"127.0.0.1:{port} is in use" in runner.stderr()
    assert not (fake_repo / "manage-calls.jsonl").exists()


def test_no_sim_imports_nothing(run_local, fake_repo: Path) -> None:
    runner = run_local("--no-sim")
    runner.wait_ready()
    assert [c["argv"][0] for c in runner.manage_calls()] == ["migrate", "shell"]
    assert not (fake_repo / "var" / "pvesim").exists()


def test_a_credentials_dir_without_the_simulators_files_is_refused_before_any_step(
    run_local, fake_repo: Path, tmp_path: Path
) -> None:
    runner = run_local(env={"PROXYHUB_CREDENTIALS_DIR": str(tmp_path / "elsewhere")})
    assert runner.proc.wait(30) == 1
    assert "does not hold the simulator's token and CA" in runner.stderr()
    assert not (fake_repo / "manage-calls.jsonl").exists()
