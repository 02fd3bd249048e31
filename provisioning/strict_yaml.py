"""YAML as proxyhub reads an operator's files (the catalogue, ``proxies create --file``).

Strictly, and with each problem under its path: a key given twice is refused, named by its key
path and both lines; a syntax error is reported with its line and column, never with the text
around it (a vendor-data block may hold secrets).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from provisioning.proxmox.config import FieldError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ConstructorError):
    """A document gives one key twice. PyYAML would silently keep the last value, so a typo'd
    copy of a block would quietly win; the catalogue refuses it instead."""

    def __init__(self, duplicates: list[tuple[str, str]]) -> None:
        self.duplicates = duplicates
        super().__init__(problem="; ".join(f"{path}: {msg}" for path, msg in duplicates))


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses duplicate keys, naming each by its key path.

    ``construct_mapping`` only sees one mapping node, not where it sits, so
    ``construct_document`` first records every node's path; duplicates found while the
    document is built are raised together once it is complete, which leaves the loader ready
    for the next document of the stream.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._paths: dict[int, str] = {}
        self._duplicates: list[tuple[int, str, str]] = []

    def construct_document(self, node: Node) -> Any:
        self._paths = {}
        self._duplicates = []
        _record_paths(node, "", self._paths)
        data = super().construct_document(node)
        if self._duplicates:
            found, self._duplicates = sorted(self._duplicates), []
            raise DuplicateKeyError([(path, message) for _, path, message in found])
        return data

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # ``<<`` merges are overridden by explicit keys on purpose
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class refuses unhashable keys with its own error
            line = key_node.start_mark.line + 1
            if key in seen:
                path = _join(self._paths.get(id(node), ""), str(key))
                self._duplicates.append(
                    (
                        line,
                        path,
                        f"is given twice (lines {seen[key]} and {line}); give each key once",
                    )
                )
            else:
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _record_paths(node: Node, path: str, paths: dict[int, str]) -> None:
    if id(node) in paths:  # an alias: keep the path where the anchor was defined
        return
    paths[id(node)] = path
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else "?"
            _record_paths(value_node, _join(path, str(key)), paths)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _record_paths(item, f"{path}[{index}]", paths)


def yaml_load_strict(
    text: str, source: str, *, single: bool = False
) -> tuple[list[object], list[FieldError]]:
    """Every document of ``text`` (``None`` for one refused), and the problems found.

    Problems carry paths ``SOURCE[INDEX].key.path``, or ``SOURCE.key.path`` with ``single``
    (a file that must hold one document). A syntax error ends the stream and is reported with
    its line, never with the text around it (a vendor-data block may hold secrets).
    """
    loader = _StrictLoader(text)
    documents: list[object] = []
    problems: list[FieldError] = []
    try:
        while loader.check_data():
            where = source if single else f"{source}[{len(documents)}]"
            try:
                documents.append(loader.get_data())
            except DuplicateKeyError as err:
                documents.append(None)
                problems.extend(FieldError(_under(where, p), msg) for p, msg in err.duplicates)
    except yaml.MarkedYAMLError as err:
        problems.append(FieldError(source, _syntax_problem(err)))
    except yaml.YAMLError:
        problems.append(FieldError(source, "is not valid YAML"))
    finally:
        loader.dispose()
    if single and len(documents) > 1:
        problems.append(FieldError(source, "must hold one YAML document, not several"))
    return documents, problems


def _under(prefix: str, path: str) -> str:
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _syntax_problem(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(part for part in (err.context, err.problem) if part)
    return f"is not valid YAML: {where}{what or 'cannot be parsed'}"


def read_text(path: str) -> tuple[str | None, FieldError | None]:
    """A file's text, or the problem reading it (never its content)."""
    try:
        return Path(path).read_text(encoding="utf-8"), None
    except UnicodeDecodeError:
        return None, FieldError(path, "is not UTF-8 text")
    except OSError as err:
        return None, FieldError(path, f"cannot be read: {err.strerror or type(err).__name__}")
