"""Loading YAML while remembering where every value came from (for error messages), and
interpolating ${VAR} / ${VAR:-default} from the environment (for secrets)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eos.errors import ConfigError

Path_ = tuple[str | int, ...]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


@dataclass
class LoadedYaml:
    data: Any
    file: str
    lines: dict[Path_, int] = field(default_factory=dict)
    from_env: set[Path_] = field(default_factory=set)
    blocks: set[Path_] = field(default_factory=set)  # block scalars (`|`, `>`): their text starts a line later
    text: str = ""  # the file's text, to find a line of a multi-line value in it

    def line_of(self, path: Path_) -> int | None:
        """Line of the deepest known node on `path` (1-based)."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None

    def where(self, path: Path_) -> str:
        line = self.line_of(path)
        return f"{self.file}:{line}" if line else self.file

    def text_line(self, path: Path_, line_in_text: int) -> int | None:
        """The file's line of line `line_in_text` (1-based) of the text value at `path`, such as a
        transform's SQL: where an error inside the text is."""
        start = self.lines.get(path)
        if start is None:
            return None
        value = self.value_at(path)
        wanted = value.splitlines()[line_in_text - 1].strip() if isinstance(value, str) else ""
        if wanted:
            # Found in the file itself: a quoted or plain scalar folds its lines (an empty line in
            # the file is a line break in the value), so counting lines would go wrong there.
            quoted = (wanted, wanted.replace("'", "''"), wanted.replace('"', '\\"'))  # as each style writes it
            for number, line in enumerate(self.text.splitlines()[start - 1 :], start):
                if any(form in line for form in quoted):
                    return number
        return start + (1 if path in self.blocks else 0) + max(0, line_in_text - 1)

    def value_at(self, path: Path_) -> Any:
        value = self.data
        for part in path:
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                return None
        return value


_TYPED = {f"tag:yaml.org,2002:{kind}" for kind in ("int", "float", "bool")}


def _interpolate(text: str, where: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable {name} is not set",
            hint=f"export {name}=... or write ${{{name}:-default}}",
        )

    return _ENV.sub(replace, text)


def _convert(node: yaml.Node, path: Path_, out: LoadedYaml, env: Mapping[str, str]) -> Any:
    out.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in result:
                raise ConfigError(f"{out.file}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
            result[key] = _convert(value_node, (*path, key), out, env)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, (*path, i), out, env) for i, item in enumerate(node.value)]
    if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        out.blocks.add(path)
    value = yaml.SafeLoader("").construct_object(node, deep=True)
    if isinstance(value, str) and "${" in value:
        out.from_env.add(path)
        interpolated = _interpolate(value, f"{out.file}:{node.start_mark.line + 1}", env)
        # A whole-value reference to a number or boolean keeps its YAML type; anything else stays
        # the text it is (a password such as `a #b`, `'q'` or `[x` is not YAML to parse).
        typed = _ENV.fullmatch(value) and yaml.resolver.Resolver().resolve(yaml.ScalarNode, interpolated, (True, False))
        value = yaml.safe_load(interpolated) if typed in _TYPED else interpolated
    return value


def load_yaml(path: str | Path, env: Mapping[str, str] | None = None) -> LoadedYaml:
    file = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline file {file}: {exc.strerror or exc}") from exc
    return parse_yaml(text, file, env)


def parse_yaml(text: str, file: str = "<string>", env: Mapping[str, str] | None = None) -> LoadedYaml:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else file
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from exc
    out = LoadedYaml(None, file, text=text)
    if node is None:
        raise ConfigError(f"{file}: the pipeline file is empty")
    out.data = _convert(node, (), out, os.environ if env is None else env)
    return out
