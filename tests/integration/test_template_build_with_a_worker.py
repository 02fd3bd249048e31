"""A template build with a real broker and a real worker process (issue 14).

``manage.py templates build --wait --json`` journals the build; the worker runs it against the
HTTPS simulator, which downloads the image from this test's loopback server; the catalogue then
names the template and a proxy cloned from it runs.
"""

from __future__ import annotations

import pytest
from itstack import Stack, Worker

from tests.support.imageserver import image_server

pytestmark = pytest.mark.integration

VMID = 9300


def test_a_build_runs_on_a_worker_and_its_template_serves_a_proxy(
    stack: Stack, worker: Worker
) -> None:
    with image_server(b"cloud-image-over-the-wire" * 128) as served:
        result = stack.manage_json(
            "templates", "build", "--cluster", "pvesim", "--node", "pve1",
            "--image-url", served.url(), "--checksum", served.checksum,
            "--vmid", str(VMID), "--storage", "vmstore", "--bridge", "vmbr0",
            "--key", "built-13", "--template-version", "built-13-1", "--guest-user", "debian",
            "--wait", "--timeout", "90", "--json",
        )  # fmt: skip
        assert served.requests == ["/debian-13-genericcloud-amd64.qcow2"]
    assert (result["state"], result["vmid"], result["templateKey"]) == (
        "succeeded",
        VMID,
        "built-13",
    )
    config = stack.sim.vm_config("pve1", VMID)
    assert str(config["template"]) == "1" and config["vga"] == "serial0"

    stack.manage(
        "proxies", "create", "from-built", "--cluster", "pvesim", "--machine-type", "small",
        "--image", "built-13",
    )  # fmt: skip
    stack.wait_phase(["from-built"], "Running", timeout=90)
