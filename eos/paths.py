"""Where eos keeps its files: the jar cache and broker data ($EOS_HOME), and the ops files."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent  # a source checkout (also under an editable install); installed: site-packages


def eos_home() -> Path:
    """Cache and state root: $EOS_HOME, else $XDG_CACHE_HOME/eos, else ~/.cache/eos."""
    if os.environ.get("EOS_HOME"):
        return Path(os.environ["EOS_HOME"]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "eos"


def _data(name: str) -> Path:
    """The folder `name` (ops, schemas, examples) of eos's data files: inside the package when eos
    is installed from a wheel (eos/_ops, eos/_schemas, eos/_examples), else the checkout's.

    The package's copy comes first: installed, the folder beside the package is site-packages,
    where another distribution's top-level `ops` package (Canonical's charm framework, say) or
    `examples` folder may live, and must not be taken for eos's."""
    packaged = PACKAGE_DIR / f"_{name}"
    return packaged if packaged.is_dir() else REPO_DIR / name


def ops_dir() -> Path:
    """ops/ (the local servers' poms and settings); $EOS_OPS_DIR overrides it."""
    if os.environ.get("EOS_OPS_DIR"):
        return Path(os.environ["EOS_OPS_DIR"]).resolve()
    return _data("ops")


def schemas_dir() -> Path:
    """schemas/ (the demo's and examples' Avro schemas)."""
    return _data("schemas")


def examples_dir() -> Path:
    return _data("examples")
