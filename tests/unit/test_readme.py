"""The README shows what works: its pipeline example validates, its commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from eos.cli import build_parser
from eos.config import parse_pipeline
from eos.declared import connectors, pipeline_info

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_readme_pipeline_example_is_valid():
    example = re.search(r"```yaml\n(name: .*?)```", README, re.S)
    assert example, "the README lost its pipeline example"
    config = parse_pipeline(example.group(1), env={"PG_DSN": "postgresql://eos@db/eos"})
    assert config.sources[0].on_error == "dlq" and config.epochs.output_mode == "update"
    found = connectors(config, pipeline_info(config, "readme", None))
    for connector in [*found.sources, *found.sinks]:
        connector.validate()  # its schema files exist and parse


def test_the_readme_links_to_files_that_exist():
    root = Path(__file__).resolve().parents[2]
    for target in re.findall(r"\]\(((?:docs|examples)/[^)#]+)\)", README):
        assert (root / target).exists(), f"README links to {target}, which does not exist"


def test_the_readme_is_short_enough_to_read():
    assert len(README.split()) < 1700, "the README grew past what a new user reads: move details to docs/"


def test_the_readme_commands_exist():
    subparsers = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    documented = re.findall(r"^\| `eos ([\w-]+)", README, re.M)
    assert len(documented) >= 8
    for command in documented:
        assert command in subparsers.choices, f"README documents `eos {command}`, which does not exist"
