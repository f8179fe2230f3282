"""Building blocks of the pipeline file's typed config, shared by the core and the connectors
(each connector brings the config model of its own section)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

# Names that end up in topic names, transactional ids and SQL views. `/` never appears in a name:
# eos uses it as the separator of the ids it builds, so no two names can produce the same id.
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
VIEW = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"
SINK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"  # no "." either: `source.dlq` names are eos's own
SECRET_KEY = re.compile(r"(?i)(password|secret|token|jaas|credential|apikey|api\.key)")
ClientValue = str | int | float | bool

_UNITS = {
    **dict.fromkeys(("ms", "msec", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def parse_duration(value: Any) -> float:
    """'500ms', '2s', '1 minute', 3 (seconds) -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 500ms, 2s or 1 minute")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value).lower())
        if not match or match.group(2) not in _UNITS:
            raise ValueError(f"{value!r} is not a duration; write e.g. 500ms, 2s, 1m or '1 minute'")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Duration = Annotated[float, BeforeValidator(parse_duration)]


def redacted(value: Any, key: str = "") -> Any:
    """A copy fit to print or log: values under secret-looking keys are masked."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    if isinstance(value, dict):
        return {k: ("***" if SECRET_KEY.search(str(k)) else redacted(v, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    return value
