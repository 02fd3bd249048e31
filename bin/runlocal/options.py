"""The command line of bin/run-local (``make run RUN_ARGS=...``) and its defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

# ``realistic`` keeps the real host's proportions (seed 000 F16, F21) and the 0.4 scale brings
# boot-to-address down to 8 s for the default template (agent baked in) and 20 s for one whose
# agent the seed's vendor-data installs, so a first proxy is Running well within a minute even
# with the workers' polling countdowns on top.
SIM_PROFILE = "realistic"
SIM_TIME_SCALE = 0.4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bin/run-local",
        description="Run proxyhub on this machine: migrate, the Proxmox simulator, "
        "the admin user, then web, worker and Beat until Ctrl-C.",
    )
    parser.add_argument("--web-port", type=int, default=8000, help="port of the admin on 127.0.0.1")
    parser.add_argument(
        "--sim-port", type=int, default=0, help="simulator port; 0 picks a free one"
    )
    parser.add_argument("--sim-profile", default=SIM_PROFILE, help="instant, fast or realistic")
    parser.add_argument(
        "--sim-time-scale", type=float, default=SIM_TIME_SCALE, help="multiplies every duration"
    )
    parser.add_argument(
        "--no-sim",
        action="store_true",
        help="start no simulator and import no catalogue (a real cluster is already imported)",
    )
    parser.add_argument(
        "--var",
        default=os.environ.get("PROXYHUB_VAR_DIR") or "var",
        help="state directory, relative to the repository (default: $PROXYHUB_VAR_DIR or var)",
    )
    return parser.parse_args(argv)
