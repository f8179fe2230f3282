"""Where eos keeps its files: the jar cache and broker data ($EOS_HOME), and the ops files."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


def eos_home() -> Path:
    """Cache and state root: $EOS_HOME, else $XDG_CACHE_HOME/eos, else ~/.cache/eos."""
    if os.environ.get("EOS_HOME"):
        return Path(os.environ["EOS_HOME"]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "eos"


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.exists():
            return candidate
    return candidates[0]


def ops_dir() -> Path:
    """`ops/` of a source checkout; a wheel carries ops/kafka as eos/_ops."""
    if os.environ.get("EOS_OPS_DIR"):
        return Path(os.environ["EOS_OPS_DIR"]).resolve()
    return _first_existing(REPO_DIR / "ops", PACKAGE_DIR / "_ops")


def schemas_dir() -> Path:
    return _first_existing(REPO_DIR / "schemas", PACKAGE_DIR / "_schemas")


def examples_dir() -> Path:
    return _first_existing(REPO_DIR / "examples", PACKAGE_DIR / "_examples")
