"""bin/audit's verdict on pip-audit's JSON: clean, advisories, or plainly no verdict."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "bin" / "audit"


def _audit() -> Any:
    loader = importlib.machinery.SourceFileLoader("bin_audit", str(SCRIPT))
    spec = importlib.util.spec_from_loader("bin_audit", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_package_looked_up_and_clean_is_exit_0() -> None:
    code, lines = _audit().verdict(
        {"dependencies": [{"name": "django", "version": "5.2.19", "vulns": []}]}
    )
    assert code == 0 and lines == ["all 1 packages looked up: no known vulnerabilities"]


def test_an_advisory_is_exit_1_and_names_the_fix() -> None:
    report = {
        "dependencies": [
            {
                "name": "urllib3",
                "version": "2.6.3",
                "vulns": [{"id": "GHSA-xxxx", "fix_versions": ["2.7.1"]}],
            },
            {"name": "django", "version": "5.2.19", "vulns": []},
        ]
    }
    code, lines = _audit().verdict(report)
    assert code == 1
    assert "urllib3 2.6.3: GHSA-xxxx (fixed in 2.7.1)" in lines
    assert "1 of 2 packages have known vulnerabilities" in lines


def test_packages_the_database_could_not_look_up_are_no_verdict_not_clean() -> None:
    """pip-audit itself says "No known vulnerabilities found" when it skipped every package
    because its database was unreachable; the script says there is no verdict (exit 2)."""
    report = {
        "dependencies": [
            {"name": "django", "skip_reason": "Dependency not found on PyPI: django (5.2.19)"},
            {"name": "celery", "version": "5.6.3", "vulns": []},
        ]
    }
    code, lines = _audit().verdict(report)
    assert code == 2
    assert lines[-1].startswith("no verdict for 1 of 2 packages")
    assert "not looked up: Dependency not found on PyPI: django (5.2.19)" in lines
