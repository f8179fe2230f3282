"""Building a connector's typed entry from keyword arguments (the Python API's `kafka.Source(...)`,
`postgres.Sink(...)`), with pydantic's complaints turned into one clear eos error."""

from __future__ import annotations

from typing import Any, TypeVar

from eos.api import ConfigError, Model

M = TypeVar("M", bound=Model)


def entry(model: type[M], what: str, data: dict[str, Any]) -> M:
    from pydantic import ValidationError

    try:
        return model.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            problems.append(f"{where}: {str(error['msg']).removeprefix('Value error, ')}")
        raise ConfigError(f"{what}: {'; '.join(problems)}") from None
