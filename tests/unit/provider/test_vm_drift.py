"""What counts as drift and what a repair writes (``proxmox/drift.py``, issue 14)."""

from __future__ import annotations

from provisioning.proxmox.drift import Drift, Spec, config_drift, figures, repair_values
from provisioning.proxmox.netcfg import with_mac

SPEC = Spec(cores=1, memory_mib=1024, bridge="vmbr0", vlan_tag=20, mac="bc:24:11:00:00:01")
IN_STEP = {
    "cores": "1",
    "memory": "1024",
    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20",
}


def test_a_config_holding_the_spec_has_no_drift() -> None:
    assert config_drift(IN_STEP, SPEC) == []
    assert config_drift({**IN_STEP, "memory": "current=1024"}, SPEC) == []  # §5.6's long form
    assert repair_values(IN_STEP, SPEC) == {}


def test_every_field_that_differs_is_named_with_what_is_wanted_and_what_is_there() -> None:
    config = {"net0": "e1000=BC:24:11:00:00:02,bridge=vmbr1", "cores": "2"}  # memory unset: 512
    assert config_drift(config, SPEC) == [
        Drift("cores", "1", "2"),
        Drift("memory", "1024", "512"),
        Drift("net0.bridge", "vmbr0", "vmbr1"),
        Drift("net0.tag", "20", ""),
        Drift("net0.mac", "bc:24:11:00:00:01", "bc:24:11:00:00:02"),
    ]


def test_bridge_and_tag_are_not_enforced_when_the_cluster_does_not_set_them() -> None:
    loose = Spec(cores=1, memory_mib=1024)
    assert config_drift({**IN_STEP, "net0": "virtio=BC:24:11:00:00:09,bridge=vmbr7"}, loose) == []


def test_repair_rewrites_net0_in_place_keeping_the_model_and_other_options() -> None:
    config = {**IN_STEP, "net0": "e1000=BC:24:11:00:00:02,bridge=vmbr1,firewall=1,tag=30"}
    assert repair_values(config, SPEC) == {
        "net0": "e1000=BC:24:11:00:00:01,bridge=vmbr0,firewall=1,tag=20"
    }


def test_with_mac_sets_the_model_key_or_macaddr() -> None:
    assert with_mac("virtio=AA:AA:AA:AA:AA:AA,bridge=vmbr0", "bc:24:11:00:00:01") == (
        "virtio=BC:24:11:00:00:01,bridge=vmbr0"
    )
    assert with_mac("model=virtio,macaddr=AA:AA:AA:AA:AA:AA", "bc:24:11:00:00:01") == (
        "model=virtio,macaddr=BC:24:11:00:00:01"
    )


def test_the_listing_figures_of_a_vm_built_to_the_spec() -> None:
    assert figures({"maxcpu": 1, "maxmem": 1024 * 1024 * 1024}) == SPEC.figures()
    assert figures({}) == "0/0"


def test_a_spec_record_round_trips() -> None:
    assert Spec.from_record(SPEC.to_record()) == SPEC
    assert Spec.from_record({"cores": 2, "memoryMiB": 512}) == Spec(2, 512)
