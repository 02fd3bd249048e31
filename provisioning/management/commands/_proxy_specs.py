"""What ``proxies create`` was given, as ``ProxySpec`` values ready for the service.

Names with flags, ``--count N --prefix P`` or a ``--file`` of proxies: every name, cluster and
placement is checked before anything is created, and every problem is reported at once, under
the flag or the file path (``proxies.yaml[3].machineType``) where the operator typed it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import models

from provisioning.models import Cluster, Proxy
from provisioning.proxmox.credentials import FileRule, read_confined
from provisioning.services.operations import (
    CLOUD_INIT_MAX_BYTES,
    ProxySpec,
    numbered_names,
    validate_placement,
)
from provisioning.strict_yaml import read_text, yaml_load_strict

# One transaction writes a whole ``--count`` batch; a typo must not write a million rows.
COUNT_MAX = 10_000

FILE_KEYS = ("name", "cluster", "machineType", "image", "zone", "cloudInit", "cloudInitFile")
FILE_REQUIRED = ("name", "cluster", "machineType", "image")
# Service field name → where the operator typed it, per form.
_FLAG_FOR = {"zone": "--zone", "machine_type": "--machine-type", "image": "--image"}
_KEY_FOR = {"zone": "zone", "machine_type": "machineType", "image": "image", "name": "name"}


class _CloudInitFileProblem(Exception):
    """A ``cloudInitFile`` (or ``--cloud-init``) that cannot be used; the text says why."""


# Issue 11: a proxies file may name cloud-init only beside it or below it, a regular file of at
# most the admin's limit; never an absolute path, a ``..`` or a symlink leaving its directory.
_CLOUD_INIT_FILE = FileRule(
    "cloudInitFile",
    CLOUD_INIT_MAX_BYTES,
    _CloudInitFileProblem,
    _CloudInitFileProblem,
    root_name="the directory of the proxies file, {root}",
)
_CLOUD_INIT_FLAG = FileRule(
    "--cloud-init", CLOUD_INIT_MAX_BYTES, _CloudInitFileProblem, _CloudInitFileProblem
)


def _cloud_init_beside(base: Path, value: str) -> bytes:
    """``value`` read relative to ``base`` (the proxies file's directory), confined to it."""
    if os.path.isabs(value):
        raise _CloudInitFileProblem(
            f"must be a path relative to the directory of the proxies file ({base}), "
            f"not an absolute path; got {value!r}"
        )
    return read_confined(os.path.join(base, value), _CLOUD_INIT_FILE, str(base))


def cluster_named(name: str) -> Cluster:
    found = Cluster.objects.filter(name=name).first()
    if found is None:
        known = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
        raise CommandError(f"no cluster is named {name} (clusters: {known})")
    return found


def names_for_count(prefix: str | None, count: int) -> list[str]:
    if not prefix:
        raise CommandError("--count needs --prefix P (the proxies are named P-1 .. P-N)")
    if not 1 <= count <= COUNT_MAX:
        raise CommandError(f"--count must be from 1 to {COUNT_MAX}, got {count}")
    return numbered_names(prefix, count)


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "a proxy needs a name"
    try:
        field = Proxy._meta.get_field("name")
        assert isinstance(field, models.Field)
        field.run_validators(name)
    except ValidationError as err:
        return "; ".join(err.messages)
    return None


def _placement_problems(
    cluster: Cluster, *, zone: str, machine_type: str, image: str
) -> dict[str, str]:
    try:
        validate_placement(cluster, zone=zone, machine_type=machine_type, image=image)
    except ValidationError as err:
        return {field: "; ".join(messages) for field, messages in err.message_dict.items()}
    return {}


def specs_from_flags(names: list[str], options: Mapping[str, Any]) -> list[ProxySpec]:
    missing = [
        "--" + f.replace("_", "-") for f in ("cluster", "machine_type", "image") if not options[f]
    ]
    if missing:
        raise CommandError(f"also give {', '.join(missing)}")
    cluster = cluster_named(options["cluster"])
    cloud_init = b""
    if options["cloud_init"]:
        # A path the operator typed: any directory, but a regular file within the size limit.
        try:
            cloud_init = read_confined(options["cloud_init"], _CLOUD_INIT_FLAG, None)
        except _CloudInitFileProblem as err:
            raise CommandError(f"nothing was created: {err}") from None
    zone, machine_type, image = options["zone"], options["machine_type"], options["image"]
    problems = [
        f"{_FLAG_FOR.get(field, field)}: {message}"
        for field, message in _placement_problems(
            cluster, zone=zone, machine_type=machine_type, image=image
        ).items()
    ]
    for name in names:
        problem = _name_problem(name)
        if problem:
            problems.append(f"{name}: {problem}")
    if problems:
        raise CommandError("nothing was created: " + "; ".join(problems))
    return [
        ProxySpec(
            name=name,
            cluster=cluster,
            machine_type=machine_type,
            image=image,
            zone=zone,
            cloud_init=cloud_init,
        )
        for name in names
    ]


def specs_from_file(path: str) -> list[ProxySpec]:
    """The proxies of a ``--file``; every problem is collected under its path first."""
    text, problem = read_text(path)
    if problem is not None or text is None:
        raise CommandError(str(problem))
    documents, found = yaml_load_strict(text, path, single=True)
    problems = [str(p) for p in found]
    items = documents[0] if len(documents) == 1 else None
    if not problems and not isinstance(items, list):
        problems.append(f"{path}: must be a YAML list of proxies")
    if not problems and not items:
        problems.append(f"{path}: lists no proxies")
    specs: list[ProxySpec] = []
    clusters: dict[str, Cluster | None] = {}
    placements: dict[tuple[int, str, str, str], dict[str, str]] = {}
    base = Path(path).absolute().parent
    for index, entry in enumerate(items if isinstance(items, list) and not problems else []):
        where = f"{path}[{index}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: must be a map with {', '.join(FILE_REQUIRED)}")
            continue
        before = len(problems)
        for key in entry:
            if key not in FILE_KEYS:
                problems.append(
                    f"{where}.{key}: is not a known key; allowed: {', '.join(FILE_KEYS)}"
                )
        for key in FILE_KEYS:
            value = entry.get(key)
            if value is None:
                if key in FILE_REQUIRED:
                    problems.append(f"{where}.{key}: is required")
            elif not isinstance(value, str):
                problems.append(f"{where}.{key}: must be text")
        if entry.get("cloudInit") is not None and entry.get("cloudInitFile") is not None:
            problems.append(f"{where}.cloudInitFile: give cloudInit or cloudInitFile, not both")
        if len(problems) > before:
            continue
        name_problem = _name_problem(entry["name"])
        if name_problem:
            problems.append(f"{where}.name: {name_problem}")
        cluster_name = entry["cluster"]
        if cluster_name not in clusters:
            clusters[cluster_name] = Cluster.objects.filter(name=cluster_name).first()
        cluster = clusters[cluster_name]
        if cluster is None:
            problems.append(f"{where}.cluster: no cluster is named {cluster_name}")
            continue
        zone, machine_type, image = entry.get("zone") or "", entry["machineType"], entry["image"]
        key = (cluster.pk, zone, machine_type, image)
        if key not in placements:
            placements[key] = _placement_problems(
                cluster, zone=zone, machine_type=machine_type, image=image
            )
        problems.extend(f"{where}.{_KEY_FOR[f]}: {m}" for f, m in placements[key].items())
        cloud_init = (entry.get("cloudInit") or "").encode()
        if entry.get("cloudInitFile"):
            try:
                cloud_init = _cloud_init_beside(base, entry["cloudInitFile"])
            except _CloudInitFileProblem as err:
                problems.append(f"{where}.cloudInitFile ({entry['name']}): {err}")
        specs.append(
            ProxySpec(
                name=entry["name"],
                cluster=cluster,
                machine_type=machine_type,
                image=image,
                zone=zone,
                cloud_init=cloud_init,
            )
        )
    if problems:
        raise CommandError(
            "the proxies file was refused; nothing was created:\n  " + "\n  ".join(problems)
        )
    return specs
