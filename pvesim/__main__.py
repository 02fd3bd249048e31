"""``python -m pvesim``: the simulator over HTTPS, without Django.

Same options as ``manage.py pvesim`` (DESIGN.md §7). When ready it prints exactly one JSON line
to stdout (``url``, ``tokenFile``, ``caFile``, ``catalogue``) and serves until SIGINT or SIGTERM,
then exits 0. Everything else it has to say goes to stderr, so a parent process can read the
line without parsing anything else.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from .profiles import PROFILES
from .server import SimServer
from .workdir import prepare_workdir, ready_line, write_catalogue

log = logging.getLogger("proxyhub.pvesim")


def add_arguments(parser: argparse.ArgumentParser, *, default_workdir: str = "var/pvesim") -> None:
    """The simulator's options; ``manage.py pvesim`` adds the very same ones."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8006, help="port; 0 picks a free one")
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="fast", help="how long things take"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every duration of the profile by this factor",
    )
    parser.add_argument(
        "--node-task-limit",
        type=int,
        default=None,
        help="tasks each node runs at once, more wait in its queue (default: the profile's)",
    )
    parser.add_argument(
        "--workdir", default=default_workdir, help="CA, certificate, token and catalogue go here"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="WARNING",
        help="logging level of the simulator's stderr log",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pvesim",
        description="A Proxmox VE API simulator over HTTPS with a generated CA.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.time_scale < 0:
        parser.error("--time-scale must not be negative")
    if args.node_task_limit is not None and args.node_task_limit < 1:
        parser.error("--node-task-limit must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    # Imported here so ``--help`` works even while the engine cannot be imported.
    from .simulator import Simulator

    workdir = prepare_workdir(args.workdir, args.host)
    engine = Simulator(
        profile=args.profile,
        time_scale=args.time_scale,
        node_task_limit=args.node_task_limit,
        token_id=workdir.token_id,
        token_secret=workdir.token_secret,
    )
    server = SimServer(
        engine,
        args.host,
        args.port,
        certfile=str(workdir.cert_file),
        keyfile=str(workdir.key_file),
    )
    write_catalogue(
        workdir,
        url=server.url,
        nodes=engine.node_names(),
        template_vmid=engine.default_template_vmid(),
    )

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    server.start()
    print(ready_line(workdir, server.url), flush=True)
    log.info("pvesim serving at %s (profile %s)", server.url, args.profile)
    while not stop.wait(1.0):
        pass
    server.stop()
    close = getattr(engine, "close", None)
    if callable(close):
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
