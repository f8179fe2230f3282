"""Keys and values: bytes on Kafka, columns in Spark.

- config.py: `key_format:` / `value_format:` (raw, string, json, avro; schemas from .avsc files;
  Avro also through a Schema Registry's wire format);
- decode.py: a source's rows decoded, poison marked (Avro is decoded in the read task itself);
- encode.py: a sink's view as the key, value and headers its slot writers produce (Avro is
  encoded by the writer itself);
- avro.py, avro_schema.py, registry.py: Avro per Arrow batch with fastavro, schemas as Spark
  types, registries.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eos.api import ConfigError
from eos_connectors.formats.avro_schema import load_avsc, record_fields_ddl, spark_type
from eos_connectors.formats.ddl import check_ddl, is_ddl

if TYPE_CHECKING:  # the read side imports this package too: the config models (pydantic) stay out of it
    from eos_connectors.formats.config import FormatConfig


def check_formats(owner: str, formats: dict[str, FormatConfig], base_dir: Path | None = None) -> None:
    """Load and check every schema file named, and that a registry's CA file can be read, before
    anything starts (registries are asked later, when the stream is built)."""
    for which, fmt in formats.items():
        try:
            if fmt.registry is not None and fmt.registry.ca_file:
                _check_ca_file(fmt.registry.ca_file, base_dir)
            if fmt.schema_file and fmt.type in ("json", "csv") and is_ddl(fmt.schema_file):
                check_ddl(fmt.schema_file)
                continue
            for name in (fmt.schema_file, fmt.reader_schema):
                if name:
                    schema = load_avsc(name, base_dir)
                    if fmt.type in ("json", "csv"):
                        record_fields_ddl(schema)
                    else:
                        spark_type(schema)
        except ConfigError as exc:
            raise ConfigError(f"{owner}: {which}: {exc.message}", exc.hint) from None


def _check_ca_file(name: str, base_dir: Path | None) -> None:
    import ssl

    path = Path(name).expanduser()
    path = path if path.is_absolute() else (base_dir or Path.cwd()) / path
    try:
        ssl.create_default_context(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"registry: ca_file {path}: not a readable PEM file of CA certificates ({exc})",
            hint="give the CA that signed the registry's certificate, as PEM",
        ) from None


__all__ = ["check_formats", "load_avsc", "spark_type"]
