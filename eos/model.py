"""Building blocks of the pipeline file's typed config, shared by the core and the connectors
(each connector brings the config model of its own section)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

# Names that end up in topic names, transactional ids and SQL views. `/` never appears in a name:
# eos uses it as the separator of the ids it builds, so no two names can produce the same id.
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
VIEW = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"
SINK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"  # no "." either: `source.dlq` names are eos's own
# What is secret, decided here for everything that shows, logs, pins or hands on config: `eos
# validate --json`, reprs and errors (redacted), the checkpoint's replay config, and the settings
# Spark must not see on its command line (eos.sparksession). By the setting's name: librdkafka's
# secret-holding properties (sasl.password, ssl.key.password, ssl.keystore.password, ssl.key.pem,
# ssl_key, sasl.oauthbearer.client.secret, sasl.oauthbearer.config, the assertion's private key and
# passphrase), Spark's and Hadoop's (spark.authenticate.secret, spark.ssl.*Password, fs.s3a.secret.key,
# access.key, session.token, fs.azure.account.key.*, ...private.key), libpq's (password, sslpassword),
# a registry's basic.auth.user.info, and any name with a word for a secret in it. `token` and
# `key` count as whole words only: `tokenizer`, `key_format` and `ssl.key.location` (a path) stay
# readable.
SECRET_KEY = re.compile(
    r"(?i)password|passwd|passphrase|secret|credential|jaas|authorization"
    r"|token(?=$|[._-])"
    r"|(?:^|[._-])(?:api|access|account|private)[._-]?key(?=$|[._-])"
    r"|(?:^|[._-])user[._-]?info(?=$|[._-])"
    r"|(?:^|[._-])ssl[._-]key(?:[._-]pem)?$"
    r"|sasl[._-]oauthbearer[._-]config"
)
# Secrets inside a value, whatever its name: the password of a URL's `user:password@`, and a
# `password=...` pair (a libpq connection string, a JDBC URL's query, a JAAS line).
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)[^@\s/]*(@)")
_PASSWORD_PAIR = re.compile(r"""(?i)(\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;]+)""")
MASK = "***"
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

    def __repr_args__(self) -> Any:
        """repr() and str() of every config model: with its secrets masked (redacted), as a
        traceback's locals, a log line or an f-string may show them."""
        for name, value in super().__repr_args__():
            shown = MASK if name and SECRET_KEY.search(name) else value
            yield name, shown if isinstance(shown, BaseModel) else redacted(shown, name or "")


# What the pipeline file's JSON Schema (`eos schema`) says a duration is: what parse_duration takes,
# a number of seconds or a number with a unit. JSON Schema patterns have no flag for case, so each
# letter of a unit is a class of its two cases.
_UNIT_PATTERN = "|".join("".join(f"[{c}{c.upper()}]" for c in unit) for unit in sorted(_UNITS, key=len, reverse=True))
DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": rf"^\s*\d+(\.\d+)?\s*({_UNIT_PATTERN})\s*$"},
    ],
    "description": "seconds, or a number with a unit: 500ms, 2s, 1m, '1 minute', 1h",
}
Duration = Annotated[float, BeforeValidator(parse_duration), WithJsonSchema(DURATION_SCHEMA, mode="validation")]


def masked_text(text: str) -> str:
    """`text` with the secrets written inside it masked (URL passwords, `password=` pairs)."""
    return _PASSWORD_PAIR.sub(rf"\g<1>{MASK}", _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text))


def is_secret(key: str, value: Any = None) -> bool:
    """Whether the setting `key` (with `value`) holds a secret: by its name, or inside its value."""
    return bool(SECRET_KEY.search(key)) or (isinstance(value, str) and masked_text(value) != value)


def redacted(value: Any, key: str = "") -> Any:
    """A copy fit to print, log or pin: values under secret-looking keys are masked, and so are
    secrets written inside other values."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True)
    if isinstance(value, dict):
        return {k: (MASK if SECRET_KEY.search(str(k)) else redacted(v, str(k))) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v, key) for v in value]
    if isinstance(value, str):
        return masked_text(value)
    return value
