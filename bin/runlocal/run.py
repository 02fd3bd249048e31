"""The steps of ``make run`` in order, and how a failure, Ctrl-C or SIGTERM ends them."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from . import REPO
from .admin_login import ADMIN_USER, ensure_admin, ensure_admin_password
from .console import RunError, say
from .django_commands import manage
from .environment import child_env, clear_metrics, project_python
from .options import parse_args
from .processes import start_procfile, stop_process, supervise
from .sealing_key import ensure_sealing_key
from .simulator import import_catalogue, start_simulator
from .web_port import check_port_free


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def credentials_dir(env: dict[str, str], var: Path, *, with_sim: bool) -> Path:
    """Where clusters' token and CA files may be (issue 11): the caller's
    PROXYHUB_CREDENTIALS_DIR, else the simulator's workdir, where its token and CA land. A
    caller's directory that does not hold the simulator's files would only make the catalogue
    import fail, so that is said before anything starts."""
    sim_workdir = var / "pvesim"
    given = env.get("PROXYHUB_CREDENTIALS_DIR")
    if not given:
        return sim_workdir
    chosen = (REPO / given).resolve()
    if with_sim and not sim_workdir.resolve().is_relative_to(chosen):
        raise RunError(
            f"PROXYHUB_CREDENTIALS_DIR={given} does not hold the simulator's token and CA "
            f"({sim_workdir}); unset it, or pass --no-sim (RUN_ARGS=--no-sim)"
        )
    return chosen


def run(args: argparse.Namespace) -> int:
    # Until supervise() takes over, SIGTERM unwinds like Ctrl-C, so a simulator already started
    # is stopped rather than orphaned.
    signal.signal(signal.SIGTERM, _interrupt)
    python = project_python()
    var = (REPO / args.var).resolve()
    var.mkdir(parents=True, exist_ok=True)
    # Not resolved: a venv's python is a symlink to the base interpreter.
    env = child_env(os.environ, Path(python).parent)
    env["PROXYHUB_VAR_DIR"] = str(var)  # the settings' state directory is this one
    env["PROXYHUB_CREDENTIALS_DIR"] = str(credentials_dir(env, var, with_sim=not args.no_sim))
    check_port_free(args.web_port)
    clear_metrics(env, var)
    if not env.get("PROXYHUB_SEALING_KEYS"):
        key, created = ensure_sealing_key(var)
        env["PROXYHUB_SEALING_KEYS"] = key
        if created:
            say(f"generated the key that seals cloud-init into {var / 'sealing-key'}; keep it")

    say("migrating the database")
    manage(python, ["migrate", "--noinput"], env, "migrating the database")

    simulator: subprocess.Popen[bytes] | None = None
    sim_env: dict[str, str] = {}
    try:
        if not args.no_sim:
            say(f"starting the Proxmox simulator ({args.sim_profile} x{args.sim_time_scale})")
            simulator, info = start_simulator(
                python,
                workdir=var / "pvesim",
                port=args.sim_port,
                profile=args.sim_profile,
                time_scale=args.sim_time_scale,
                env=env,
            )
            sim_env = info.env()
            say(f"simulator at {info.url}; importing its catalogue (cluster pvesim)")
            import_catalogue(python, env, info)

        password = ensure_admin_password(var)
        ensure_admin(python, env, password)
        print(
            f"Admin: http://127.0.0.1:{args.web_port}/admin/ user {ADMIN_USER} password {password}",
            flush=True,
        )
        if simulator is not None:
            say(
                "the simulated cluster lives in memory: each run starts it afresh and "
                "reconcile re-creates the proxies the database asks for"
            )

        honcho = start_procfile(python, {**env, **sim_env}, web_port=args.web_port)
    except BaseException:
        if simulator is not None:
            stop_process(simulator, "simulator")
        raise
    return supervise(honcho, simulator, web_port=args.web_port)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except RunError as exc:
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130
