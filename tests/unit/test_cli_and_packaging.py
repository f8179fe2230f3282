"""Every CLI subcommand has --help, and the packages import with no Spark or Kafka running."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from eos.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _all_command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += _all_command_paths(child, (*prefix, name))
    return paths


COMMAND_PATHS = _all_command_paths(build_parser())


def test_the_cli_has_the_documented_commands():
    names = {" ".join(p) for p in COMMAND_PATHS}
    assert {"kafka start", "kafka stop", "kafka status", "demo"} <= names


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "eos")
def test_every_subcommand_has_help(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*path, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: eos"), out[:200]


def test_packages_import_without_spark_or_kafka():
    modules = sorted(
        ".".join(p.relative_to(folder).with_suffix("").parts)
        for folder, package in ((ROOT, "eos"), (ROOT / "connectors", "eos_connectors"), (ROOT / "ops", "eos_ops"))
        for p in (folder / package).rglob("*.py")
        if p.name != "__main__.py"
    )
    code = (
        "import importlib, os, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "import glob\n"
        "def ppid(stat):\n"
        "    try: return int(open(stat).read().rsplit(')', 1)[1].split()[1])\n"
        "    except OSError: return -1\n"
        "children = [s for s in glob.glob('/proc/[0-9]*/stat') if ppid(s) == os.getpid()]\n"
        "assert not children, f'importing started processes: {children}'\n"
        "from pyspark import SparkContext\n"
        "assert SparkContext._active_spark_context is None\n"
        "print(len(sys.modules))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "EOS_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
