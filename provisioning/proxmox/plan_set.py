"""The plan set: what a confirmed bulk create is bound to, and what changed since (issue 14).

Seed 003 binds a confirmation to the exact plan that was shown: its ``planHash`` is a SHA-256
over a compact canonical JSON of the plan's inputs, and "changed plan" refuses the create. A
bulk create shows many plans at once, so here the unit is the *set*: one document holding
everything the commit depends on, hashed as one.

- ``clusters``: each cluster's plan-wide settings (storage, bridge, VLAN, ISO storage, VMID
  range, guest agent, vendor-data *digest*, seed ISO kept) and the installation.
- ``machineTypes``: each machine type used, resolved to cores, memory and disk.
- ``templates``: each image used, resolved to the template VMID (or its copy) on each node.
- ``placement``: for each cluster where placement chose nodes, what it read per node (our
  proxies, creates in flight, ready). Free memory itself is not hashed: every health check
  moves it by some bytes and would refuse every commit; what it decides, the node each proxy
  goes to, is in ``proxies``.
- ``proxies``: each proxy's spec and resolved node, the cloud-init as its keyed digest and
  length, never its content.

Every key of a single plan's hash input (``plan.HASH_FIELDS``) lands in one of these sections
(``COVERED``), so the set hash moves whenever one of its plans' hashes would. ``what_changed``
compares a shown document with the current one and says, in the operator's words, what moved.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .node_choice import PlacementInputs
from .plan import PLAN_FORMAT, Plan

PLAN_SET_FORMAT = "proxyhub-plan-set/1"

# Where each key of a plan's hash input is held in the set document (a unit test checks that
# every ``HASH_FIELDS`` key is here, so a new plan input cannot be left out of the set).
COVERED: Mapping[str, str] = {
    "format": "planFormat",
    "cluster": "proxies[].cluster",
    "installation": "clusters.installation",
    "uid": "proxies[] (none before the create)",
    "vmName": "proxies[].vmName",
    "zone": "proxies[].zone",
    "node": "proxies[].node",
    "image": "proxies[].image",
    "templateVmid": "templates",
    "vmidMin": "clusters.vmidMin",
    "vmidMax": "clusters.vmidMax",
    "vmidCandidate": "proxies[] (none before the create)",
    "machineType": "proxies[].machineType",
    "cores": "machineTypes.cores",
    "memoryMiB": "machineTypes.memoryMiB",
    "diskGiB": "machineTypes.diskGiB",
    "storage": "clusters.storage",
    "bridge": "clusters.bridge",
    "vlanTag": "clusters.vlanTag",
    "isoStorage": "clusters.isoStorage",
    "seedVolid": "proxies[].seedVolid",
    "installGuestAgent": "clusters.installGuestAgent",
    "vendorDataSha256": "clusters.vendorDataSha256",
    "cloudInitSha256": "proxies[].cloudInitSha256",
    "cloudInitBytes": "proxies[].cloudInitBytes",
    "keepSeedIso": "clusters.keepSeedIso",
}

_CLUSTER_FIELDS = (
    ("installation", "installation_id", "installation"),
    ("storage", "storage", "storage"),
    ("bridge", "bridge", "bridge"),
    ("vlanTag", "vlan_tag", "VLAN tag"),
    ("isoStorage", "iso_storage", "ISO storage"),
    ("vmidMin", "vmid_min", "VMID range start"),
    ("vmidMax", "vmid_max", "VMID range end"),
    ("installGuestAgent", "install_guest_agent", "guest agent install"),
    ("vendorDataSha256", "vendor_data_sha256", "vendor-data"),
    ("keepSeedIso", "keep_seed_iso", "seed ISO kept after boot"),
)
_MACHINE_FIELDS = (
    ("cores", "cores", "cores", ""),
    ("memoryMiB", "memory_mib", "memory", " MiB"),
    ("diskGiB", "disk_gib", "disk", " GiB"),
)
# The proxy fields compared one by one, with the words a change is told in.
_PROXY_FIELDS = (
    ("cluster", "cluster"),
    ("zone", "zone"),
    ("machineType", "machine type"),
    ("image", "image"),
    ("vmName", "VM name"),
    ("seedVolid", "seed volume"),
)
# Digests are never shown in full in a change: that they moved is what matters.
_SECRET_DIGESTS = {"vendorDataSha256", "cloudInitSha256"}
NAMES_TOLD = 10


def plan_set_document(
    plans: Sequence[tuple[str, Plan]], placements: Mapping[str, PlacementInputs]
) -> dict[str, Any]:
    """The canonical document of ``plans`` (each with its proxy's name), placed from
    ``placements`` (cluster name → what placement read; only clusters where it chose)."""
    clusters: dict[str, dict[str, Any]] = {}
    machine_types: dict[str, dict[str, Any]] = {}
    templates: dict[str, int] = {}
    proxies: list[dict[str, Any]] = []
    for name, plan in plans:
        clusters[plan.cluster] = {key: getattr(plan, attr) for key, attr, _ in _CLUSTER_FIELDS}
        machine_types[f"{plan.cluster}/{plan.machine_type}"] = {
            key: getattr(plan, attr) for key, attr, _, _ in _MACHINE_FIELDS
        }
        templates[f"{plan.cluster}/{plan.image}@{plan.node}"] = plan.template_vmid
        proxies.append(
            {
                "name": name,
                "cluster": plan.cluster,
                "vmName": plan.vm_name,
                "zone": plan.zone,
                "node": plan.node,
                "nodeSource": plan.node_source,
                "machineType": plan.machine_type,
                "image": plan.image,
                "seedVolid": plan.seed_volid,
                "cloudInitSha256": plan.cloud_init_sha256,
                "cloudInitBytes": plan.cloud_init_bytes,
            }
        )
    used = {p["cluster"] for p in proxies if p["nodeSource"] == "placement"}
    return {
        "format": PLAN_SET_FORMAT,
        "planFormat": PLAN_FORMAT,
        "clusters": clusters,
        "machineTypes": machine_types,
        "templates": templates,
        "placement": {
            cluster: {
                load.node: {
                    "proxies": load.proxies,
                    "inFlight": load.in_flight,
                    "ready": load.ready,
                }
                for load in inputs.loads
            }
            for cluster, inputs in sorted(placements.items())
            if cluster in used
        },
        "proxies": proxies,
    }


def canonical(document: Mapping[str, Any]) -> str:
    """Compact JSON with sorted keys: the same document always gives the same text."""
    return json.dumps(
        document, separators=(",", ":"), sort_keys=True, ensure_ascii=True, allow_nan=False
    )


def plan_set_hash(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(document).encode("ascii")).hexdigest()


def what_changed(shown: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between the plan set that was shown and the one the commit would make,
    one line per change, catalogue first, then placement, then the proxies. Never empty when
    the two documents differ."""
    out: list[str] = []
    if shown.get("format") != now.get("format") or shown.get("planFormat") != now.get("planFormat"):
        out.append("the plan format changed (proxyhub was upgraded); preview again")
    out += _clusters_changed(shown.get("clusters", {}), now.get("clusters", {}))
    out += _keyed_changed(
        "machine type",
        shown.get("machineTypes", {}),
        now.get("machineTypes", {}),
        lambda before, after: [
            f"{words} {before.get(key)}{unit} → {after.get(key)}{unit}"
            for key, _, words, unit in _MACHINE_FIELDS
            if before.get(key) != after.get(key)
        ],
    )
    out += _keyed_changed(
        "template",
        shown.get("templates", {}),
        now.get("templates", {}),
        lambda before, after: [f"VM {before} → VM {after}"],
        label=lambda key: _short_key(key).replace("@", " on "),
    )
    out += _placement_changed(shown.get("placement", {}), now.get("placement", {}))
    out += _proxies_changed(shown.get("proxies", []), now.get("proxies", []))
    if not out and canonical(shown) != canonical(now):
        out.append("the plan changed")
    return out


def _short_key(key: str) -> str:
    """``cluster/key`` as the operator names it: the key alone."""
    return key.split("/", 1)[-1]


def _keyed_changed(
    what: str,
    shown: Mapping[str, Any],
    now: Mapping[str, Any],
    differ: Any,
    label: Any = _short_key,
) -> list[str]:
    out = []
    for key in sorted(set(shown) | set(now)):
        if key not in now:
            out.append(f"{what} {label(key)}: no longer used by the plan")
        elif key not in shown:
            out.append(f"{what} {label(key)}: now used by the plan")
        elif shown[key] != now[key]:
            out.append(f"{what} {label(key)}: " + ", ".join(differ(shown[key], now[key])))
    return out


def _clusters_changed(shown: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    out = []
    for cluster in sorted(set(shown) & set(now)):
        before, after = shown[cluster], now[cluster]
        for key, _, words in _CLUSTER_FIELDS:
            if before.get(key) == after.get(key):
                continue
            if key in _SECRET_DIGESTS:
                out.append(f"cluster {cluster}: {words} changed")
            else:
                out.append(f"cluster {cluster}: {words} {before.get(key)} → {after.get(key)}")
    return out


def _placement_changed(shown: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    out = []
    for cluster in sorted(set(shown) & set(now)):
        before, after = shown[cluster], now[cluster]
        for node in sorted(set(before) | set(after)):
            was, is_ = before.get(node), after.get(node)
            if was == is_:
                continue
            if was is None or is_ is None:
                out.append(f"placement inputs: node {node} {'added' if was is None else 'gone'}")
                continue
            parts = [
                f"{words} {was.get(key)} → {is_.get(key)}"
                for key, words in (
                    ("proxies", "proxies"),
                    ("inFlight", "creates in flight"),
                    ("ready", "ready"),
                )
                if was.get(key) != is_.get(key)
            ]
            out.append(f"placement inputs on {node}: " + ", ".join(parts))
    return out


def _proxies_changed(
    shown: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]]
) -> list[str]:
    before = {p["name"]: p for p in shown}
    after = {p["name"]: p for p in now}
    out = []
    gone = [n for n in before if n not in after]
    added = [n for n in after if n not in before]
    if gone:
        out.append(f"no longer in the plan: {_names(gone)}")
    if added:
        out.append(f"not in the shown plan: {_names(added)}")
    # One line per (change, before, after), naming the proxies it hits: a catalogue edit
    # moves 500 proxies the same way, and says so once.
    grouped: dict[tuple[str, str], list[str]] = {}
    for name in before:
        if name not in after:
            continue
        was, is_ = before[name], after[name]
        if (was.get("node"), was.get("nodeSource")) != (is_.get("node"), is_.get("nodeSource")):
            what = (
                "placement"
                if was.get("nodeSource") == "placement" or is_.get("nodeSource") == "placement"
                else "node"
            )
            grouped.setdefault((what, f"{was.get('node')} → {is_.get('node')}"), []).append(name)
        for key, words in _PROXY_FIELDS:
            if was.get(key) != is_.get(key):
                change = f"{was.get(key) or '(blank)'} → {is_.get(key) or '(blank)'}"
                grouped.setdefault((words, change), []).append(name)
        if (was.get("cloudInitSha256"), was.get("cloudInitBytes")) != (
            is_.get("cloudInitSha256"),
            is_.get("cloudInitBytes"),
        ):
            grouped.setdefault(("cloud-init", "changed"), []).append(name)
    for (what, change), names in grouped.items():
        if what == "cloud-init":
            out.append(f"cloud-init changed for {_names(names)}")
        else:
            out.append(f"{what}: {change} for {_names(names)}")
    return out


def _names(names: Sequence[str]) -> str:
    rest = len(names) - NAMES_TOLD
    text = ", ".join(names[:NAMES_TOLD])
    return f"{text} and {rest} more" if rest > 0 else text
