"""A json or csv format's schema written as Spark DDL (`id STRING, amount DOUBLE`), the way a Spark
user writes one, instead of an .avsc file. Pydantic-free: the read side imports the formats package."""

from __future__ import annotations

import re

from eos.api import ConfigError

# Field definitions (a name, then a type) separated by commas; a file name has no space after its
# first word.
_DDL = re.compile(r"^\s*`?[A-Za-z_][\w]*`?\s+[A-Za-z]")
_FIELD = re.compile(r"^\s*(`[^`]+`|[A-Za-z_]\w*)\s+\S")


def is_ddl(schema: str) -> bool:
    """Whether a format's `schema:` is a Spark DDL string (else it names an .avsc file)."""
    return bool(_DDL.match(schema)) and not schema.strip().endswith((".avsc", ".json"))


def check_ddl(ddl: str) -> None:
    """A DDL schema's shape, without Spark: `name TYPE` fields separated by commas (Spark parses the
    types themselves when the stream is built, and reports what it cannot)."""
    depth, field, fields = 0, "", []
    for char in ddl:
        depth += 1 if char in "<(" else -1 if char in ">)" else 0
        if char == "," and depth == 0:
            fields.append(field)
            field = ""
        else:
            field += char
    fields.append(field)
    for text in fields:
        if not _FIELD.match(text):
            raise ConfigError(
                f"schema {ddl!r}: {text.strip()!r} is not a field (`name TYPE`)",
                hint='write the fields as Spark DDL: "id STRING, amount DOUBLE, at TIMESTAMP" (or name an .avsc file)',
            )
