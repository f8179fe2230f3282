"""When the source's Spark-side process ends quietly: only on the JVM's end-of-stream, never on an
EOFError of eos's own code (that one must reach Spark as the epoch's error)."""

from __future__ import annotations

import io

import pytest
from pyspark.serializers import read_int

from eos_connectors.kafka.reader import jvm_went_away


def _raised(call) -> BaseException:
    with pytest.raises(BaseException) as caught:
        call()
    return caught.value


def test_end_of_stream_from_the_jvm_is_recognised():
    assert jvm_went_away(_raised(lambda: read_int(io.BytesIO(b""))))


def test_an_eof_error_of_other_code_is_not():
    def read_ledger() -> None:
        raise EOFError("truncated ledger record")

    assert not jvm_went_away(_raised(read_ledger))
    assert not jvm_went_away(_raised(lambda: read_int(None)))  # AttributeError: not an EOF
    assert not jvm_went_away(None)
