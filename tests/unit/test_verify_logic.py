"""`eos verify`'s pure logic: canonical values and tolerances, the multiset and changelog checks,
late-record explanations, its own JSON decoding rules, its command line. No server is needed: the
Kafka client settings are checked by librdkafka itself, which refuses a bad one at creation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import types as T

from eos.cli import main as eos_main
from eos.config import load_pipeline
from eos.errors import ConfigError
from eos_ops.verify import load_spec
from eos_ops.verify_checks import Check, check_changelog, check_rows, identity_of, identity_with_fields
from eos_ops.verify_compare import (
    Instant,
    Position,
    Tolerance,
    canonical,
    equal,
    last_per_identity,
    multiset_diff,
    repeated_in_one_transaction,
)
from eos_ops.verify_decode import Poison, from_json
from eos_ops.verify_pipeline import Progress, check_dead_letters, read_kafka_sink, read_source
from tests.pipelines import write_pipeline

TOL = Tolerance()


def test_one_canonical_form_for_every_reader():
    utc = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    same_instant = [
        utc,
        utc.astimezone(timezone(timedelta(hours=2))),  # PostgreSQL timestamptz in another zone
        "2026-01-01T12:00:00.123Z",  # Spark's to_json
        "2026-01-01T14:00:00.123+02:00",  # to_json in another session time zone
        "2026-01-01 12:00:00.123456",  # a naive (wall-clock) timestamp
    ]
    assert {canonical(value) for value in same_instant} == {Instant(1_767_268_800_123)}
    assert canonical({"a": Decimal("2.50"), "b": None, "c": b"\x00\x01", "d": [Decimal("3")]}) == {
        "a": 2.5, "c": "AAE=", "d": [3]
    }  # fmt: skip
    assert canonical("not 2026-01-01") == "not 2026-01-01"


def test_floats_are_equal_within_the_tolerance():
    # The float sums of issue 36's run: Spark's and eos's order of addition differ in the last bit.
    assert equal({"total": 397.70000000000005}, {"total": 397.69999999999993}, TOL)
    assert not equal({"total": 397.7}, {"total": 397.71}, TOL)
    assert equal(397.7, 397.71, Tolerance(rel=1e-4, abs=0))
    assert equal(0.0, 1e-12, TOL) and not equal(0.0, 1e-6, TOL)  # near zero: the absolute tolerance
    assert not equal(2, 3, Tolerance(rel=1.0)) and equal(1, 1.0, TOL)  # integers exactly
    assert not equal(True, 1, TOL)


def test_multisets_match_each_row_once_floats_within_the_tolerance():
    expected = [{"k": "a", "v": 0.1 + 0.2}, {"k": "a", "v": 1.0}, {"k": "b", "v": 2.0}]
    seen = [{"k": "a", "v": 1.0}, {"k": "a", "v": 0.3}, {"k": "a", "v": 0.3}, {"k": "c", "v": 2.0}]
    lost, extra = multiset_diff(expected, seen, TOL)
    assert lost == [{"k": "b", "v": 2.0}]
    assert sorted(extra, key=str) == [{"k": "a", "v": 0.3}, {"k": "c", "v": 2.0}]


def test_a_duplicate_needs_no_transaction_boundary_between_the_two():
    """Markers take offsets: offsets 4 and 5 have none between them; 5 and 7 do."""
    records = [("DE", Position(0, 4, 0)), ("DE", Position(0, 5, 0)), ("FR", Position(0, 7, 0)),
               ("FR", Position(0, 9, 0)), ("NL", Position(1, 3, 0)), ("NL", Position(0, 10, 0))]  # fmt: skip
    assert repeated_in_one_transaction(records) == [("DE", 0, 5)]
    last = last_per_identity([("DE", "old", Position(0, 4, 9)), ("DE", "new", Position(0, 5, 1))])
    assert last == {"DE": "new"}  # by offset within a partition, whatever the timestamps


def test_rows_lost_and_unexpected_of_one_key_are_one_wrong_row():
    check = Check("sink s", "t", "")
    key = identity_of(lambda row: row["key"])
    expected = [{"key": "a", "n": 1}, {"key": "b", "n": 2}, {"key": "c", "n": 3}]
    seen = [{"key": "a", "n": 1}, {"key": "a", "n": 1}, {"key": "b", "n": 5}, {"key": "d", "n": 4}]
    check_rows(check, expected, seen, TOL, pair=key)
    assert check.duplicated == [{"key": "a", "n": 1}]
    assert check.wrong == [("b", {"key": "b", "n": 5}, {"key": "b", "n": 2})]
    assert check.lost == [{"key": "c", "n": 3}] and check.unexpected == [{"key": "d", "n": 4}]
    assert check.summary() == "1 lost, 1 duplicated, 1 unexpected, 1 wrong" and not check.ok


def test_late_records_explain_only_the_rows_they_change():
    """Windows w1 (a late record in it), w2 (all its records late), w3 (none late). The output
    holds w1 without the late record and no w2: explained. Losing w3, or w1 altogether, is not."""
    pair = identity_with_fields(lambda row: None)
    with_late = [{"w": "w1", "n": 4}, {"w": "w2", "n": 1}, {"w": "w3", "n": 2}]
    without = [{"w": "w1", "n": 3}, {"w": "w3", "n": 2}]
    check = Check("sink s", "t", "")
    check_rows(check, with_late, [{"w": "w1", "n": 3}, {"w": "w3", "n": 2}], TOL, pair, without)
    assert check.ok and len(check.late) == 3  # w1's two values, w2
    check = Check("sink s", "t", "")
    check_rows(check, with_late, [{"w": "w3", "n": 2}], TOL, pair, without)
    assert check.lost == [{"w": "w1", "n": 4}]  # w1 itself lost: no value of it in the output
    check = Check("sink s", "t", "")
    check_rows(check, with_late, [{"w": "w1", "n": 3}], TOL, pair, without)
    assert check.lost == [{"w": "w3", "n": 2}]


def test_a_changelog_is_judged_by_its_last_value_per_key():
    key = identity_of(lambda row: row["key"])
    expected = [{"key": "DE", "total": 3.0}, {"key": "FR", "total": 2.0}, {"key": "NL", "total": 1.0}]
    seen = [
        ({"key": "DE", "total": 1.0}, Position(0, 0, 0)), ({"key": "DE", "total": 3.0}, Position(0, 2, 0)),
        ({"key": "FR", "total": 9.0}, Position(1, 0, 0)), ({"key": "BE", "total": 1.0}, Position(1, 2, 0)),
    ]  # fmt: skip
    check = Check("sink s", "t", "")
    check_changelog(check, expected, seen, key, TOL)
    assert check.wrong == [("FR", {"key": "FR", "total": 9.0}, {"key": "FR", "total": 2.0})]
    assert check.lost == [{"key": "NL", "total": 1.0}] and check.unexpected == [{"key": "BE", "total": 1.0}]
    assert check.duplicated == []  # DE's earlier value is an update, not a duplicate
    table = Check("sink t", "t", "")  # a table's rows have no position: two rows of a key are duplicates
    check_changelog(table, expected[:1], [({"key": "DE", "total": 3.0}, None)] * 2, key, TOL)
    assert table.duplicated == ["DE"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (b'{"id": 1, "amount": ', "malformed JSON"),
        (b'{"id": "1", "amount": 2.5}', 'field id: "1" is not a bigint'),
        (b'{"id": 1.5, "amount": 2.5}', "field id: 1.5 is not a bigint"),
        (b'{"id": 9223372036854775808}', "is not a bigint"),
        (b'{"id": 1, "amount": "2.5"}', 'field amount: "2.5" is not a double'),
        (b'{"id": 1, "at": "yesterday"}', "field at"),
        (b'{"id": 1, "paid": "true"}', "field paid"),
        (b"[1, 2]", "a JSON list, not an object"),
    ],
)
def test_json_poison_as_spark_from_json_decides_it(text, why):
    """verify's rules agreed with Spark 4.3's from_json (PERMISSIVE, eos's reader) on 39 cases."""
    with pytest.raises(Poison, match=why):
        from_json(text, _schema(), timezone.utc)


def test_json_values_as_spark_reads_them():
    row = from_json(b'{"id": 7, "amount": 3, "at": "2026-01-01 10:00:00", "tags": ["x"], "extra": {}}', _schema(),
                    timezone.utc)  # fmt: skip
    assert row == {"id": 7, "amount": 3.0, "at": datetime(2026, 1, 1, 10, tzinfo=timezone.utc), "paid": None,
                   "tags": ["x"]}  # fmt: skip
    assert from_json(b'{"id": 1, "amount": "NaN", "tags": [1]}', _schema(), timezone.utc)["tags"] == ["1"]
    assert from_json(b"  ", _schema(), timezone.utc) is None
    assert from_json(b'{"id": 1} trailing', _schema(), timezone.utc)["id"] == 1  # Spark reads the first value


def _schema() -> T.StructType:
    return T.StructType([
        T.StructField("id", T.LongType()), T.StructField("amount", T.DoubleType()),
        T.StructField("at", T.TimestampType()), T.StructField("paid", T.BooleanType()),
        T.StructField("tags", T.ArrayType(T.StringType())),
    ])  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Client settings and the command line
# ---------------------------------------------------------------------------------------------


def _pipeline(folder: Path, config: dict) -> Path:
    (folder / "o.avsc").write_text(json.dumps({"type": "record", "name": "O", "fields": [
        {"name": "id", "type": "string"}]}))  # fmt: skip
    return write_pipeline(folder, {
        "name": "p", "checkpoint": str(folder / "ck"),
        "sources": [{"name": "orders", "kafka": {"bootstrap": "127.0.0.1:1", "topics": ["in"],
                                                 "config": {"bogus.source.setting": 1}},
                     "value_format": {"type": "json", "schema": "o.avsc"}, "on_error": "dlq", "dlq_topic": "dlq"}],
        "sinks": [{"name": "out", "kafka": {"bootstrap": "127.0.0.1:1", "topic": "out",
                                            "config": {"bogus.sink.setting": 1}}}],
        **config,
    })  # fmt: skip


def test_every_kafka_client_carries_its_entrys_settings(tmp_path):
    """The settings of each entry (`bootstrap` + `config:`) reach the clients verify makes for
    it: librdkafka refuses the unknown one it was given, as a config error naming it."""
    config = load_pipeline(_pipeline(tmp_path, {}))
    source, sink = config.sources[0], config.sinks[0]
    with pytest.raises(ConfigError, match=r"bogus\.source\.setting"):
        read_source(source, Progress(), tmp_path, "UTC")
    with pytest.raises(ConfigError, match=r"bogus\.sink\.setting"):
        read_kafka_sink(sink, tmp_path, Check("sink out", "", ""))
    with pytest.raises(ConfigError, match=r"bogus\.source\.setting"):  # the DLQ is written with the source's
        check_dead_letters(type("S", (), {"entry": source, "poison": []})(), "p")


def test_a_bad_pipeline_file_exits_2_with_eos_usual_error(tmp_path, capsys):
    path = _pipeline(tmp_path, {"epochs": {"output_mod": "update"}})
    assert eos_main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'epochs.output_mod'; did you mean 'output_mode'?" in err and "Traceback" not in err
    assert eos_main(["verify", str(path), "--input", "x"]) == 2
    assert "give a pipeline file alone" in capsys.readouterr().err


def test_a_spec_carries_client_settings_and_a_tolerance(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "bootstrap: b:9093\nconfig: {security.protocol: SASL_SSL, sasl.password: '${KAFKA_PASSWORD}'}\n"
        "input: {topic: i, format: json}\noutput: {topic: o, format: json}\nmatch: {input_id: id}\n"
        "tolerance: {rel: 0.001}\n"
    )
    loaded = load_spec(spec)
    assert loaded.kafka == {"security.protocol": "SASL_SSL", "sasl.password": "s3cret", "bootstrap.servers": "b:9093"}
    assert loaded.tolerance == Tolerance(rel=0.001)
    assert load_spec(spec, tolerance=Tolerance(0.5, 0.5)).tolerance == Tolerance(0.5, 0.5)
    client = tmp_path / "client.yaml"  # --kafka-config: settings from a file, secrets from the environment
    client.write_text("sasl.password: ${KAFKA_PASSWORD}\nbogus.cli.setting: 1\n")
    for args in (["--spec", str(spec)], ["--bootstrap", "127.0.0.1:1", "--input", "i", "--output", "o"]):
        assert eos_main(["verify", "--kafka-config", str(client), *args]) == 2
        err = capsys.readouterr().err
        assert 'No such configuration property: "bogus.cli.setting"' in err and "s3cret" not in err
    spec.write_text(spec.read_text() + "agregate: {}\n")
    assert eos_main(["verify", "--spec", str(spec)]) == 2
    assert "unknown field 'agregate'; did you mean 'aggregate'?" in capsys.readouterr().err
