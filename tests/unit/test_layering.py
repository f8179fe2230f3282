"""The tree's layering, read from the source (imports parsed, nothing run): the core (eos/) never
imports a connector or an operational tool; connectors import from the core only its public API
(eos.api); nothing imports in a cycle between the three packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "eos": ROOT / "eos",
    "eos_connectors": ROOT / "connectors" / "eos_connectors",
    "eos_ops": ROOT / "ops" / "eos_ops",
}


def imports(package: str) -> dict[str, set[str]]:
    """Module of `package` -> the absolute module names it imports (lazily or not)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGES[package].rglob("*.py"):
        module = ".".join((package, *path.relative_to(PACKAGES[package]).with_suffix("").parts))
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[module] = names
    return found


def test_the_core_imports_no_connector_and_no_tool():
    offending = {
        module: sorted(n for n in names if n.split(".")[0] in ("eos_connectors", "eos_ops"))
        for module, names in imports("eos").items()
    }
    assert not {m: n for m, n in offending.items() if n}


def test_connectors_use_only_the_public_api_of_the_core():
    offending = {
        module: sorted(n for n in names if n.split(".")[0] == "eos" and n != "eos.api")
        for module, names in imports("eos_connectors").items()
    }
    assert not {m: n for m, n in offending.items() if n}
    assert not any(n.split(".")[0] == "eos_ops" for names in imports("eos_connectors").values() for n in names)


def test_the_protocol_reads_from_the_file_names():
    files = {p.stem for p in (ROOT / "eos" / "protocol").glob("*.py")}
    assert {"plan", "slot", "coordinator", "decision", "committer", "ledger", "recovery", "checkpoint", "sink",
            "source"} <= files  # fmt: skip
