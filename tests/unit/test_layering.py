"""The tree's layering, read from the source (imports parsed, nothing run): the core (eos/) never
imports a connector or an operational tool; connectors import from the core only its public API
(eos.api); nothing imports in a cycle between the three packages. And what the source's
read side loads: Spark starts a fresh Python process per scan at every query start."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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


def test_the_public_api_loads_each_name_from_where_its_imports_say():
    """eos.api loads its names on first use (a table, eos.api._WHERE); the imports it shows type
    checkers must name the same objects."""
    import eos.api

    tree = ast.parse((ROOT / "eos" / "api.py").read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If))  # if TYPE_CHECKING:
    shown = {(a.asname or a.name): (node.module, a.name) for node in guarded.body for a in node.names}
    assert shown == eos.api._WHERE
    assert sorted(shown) == eos.api.__all__
    for name, (module, attribute) in shown.items():
        assert getattr(eos.api, name) is getattr(importlib.import_module(module), attribute)


def test_the_read_side_loads_no_configuration_models():
    """The source's planning and read processes import the reader and, for Avro, the codec
    (unpickled with the reader's options): not pydantic (~0.1 s per process)."""
    probe = (
        "import sys, eos_connectors.kafka.reader, eos_connectors.formats.avro; "
        "print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'eos.model'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
