"""No secret leaks, anywhere (docs/SECURITY.md): a distinct canary secret in every secret-bearing
field of a pipeline, a run killed with kill -9 once an epoch's commit is decided, and its recovery
with every credential rotated (which must not count as a config change), then every place a
secret could reach is scanned, and no canary may be found:

- every process's command line (/proc/*/cmdline), sampled throughout both runs;
- the runs' output (eos's and Spark's logs: local mode logs to the driver's stderr), the broker's
  folder (its log and the topics' data: the control log, the ledger, the dead-letter queue);
- every file of the checkpoint (Spark's logs and eos's `_eos/pipeline.json`);
- the /metrics page, `eos validate --json`, `eos status` (text and JSON);
- the errors raised for a wrong password (PostgreSQL; a secured Kafka broker is not in this
  fixture: its PLAINTEXT clients carry the SASL/SSL canaries without using them).

A canary counts as found in plain text and base64-encoded (a pickled option travels that way).
Reading the pipeline's secrets from `${VAR}` (as users should), the file itself holds none.

The cheaper checks that need no server sit below it: the mask over every secret setting
librdkafka, Spark and libpq know, the reprs of what carries a client config, and the replay
config, which must neither hold a credential nor change when one rotates.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eos.cli import main as eos_main
from eos.config import load_pipeline, parse_pipeline
from eos.declared import connectors, pipeline_info, replay_config
from eos.model import redacted
from eos.protocol.plan import digest
from eos_connectors.kafka.control import KafkaControlLog
from eos_connectors.kafka.reader import ReaderOptions
from eos_connectors.kafka.sink import KafkaWriterFactory
from tests.pipelines import ROOT, assert_exactly_once, committed_values, produce_numbered, write_pipeline

RECORDS, PER_EPOCH = 300, 100  # three epochs; run 1 is killed in epoch 1

# Each secret-bearing field and the environment variable the pipeline file reads it from.
KAFKA_SECRETS = (
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
)
SPARK_SECRETS = ("spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.session.token")


def _var(place: str, key: str) -> str:
    return "LEAK_" + re.sub(r"[^A-Z0-9]+", "_", f"{place}_{key}".upper())


def make_canaries() -> dict[str, str]:
    """Environment variable -> its distinct canary (letters and digits only: valid anywhere)."""
    run = uuid.uuid4().hex[:10]
    names = [_var("source", k) for k in KAFKA_SECRETS] + [_var("sink", k) for k in KAFKA_SECRETS]
    names += [_var("spark", k) for k in SPARK_SECRETS] + ["LEAK_PG_PASSWORD", "LEAK_PG_WRONG", "LEAK_API_TOKEN"]
    return {name: f"Canary{name.title().replace('_', '')}{run}" for name in names}


def _encodings(canary: str) -> list[bytes]:
    """The canary as bytes, and its base64 (standard and URL-safe) at each of the three alignments
    it can have in a longer encoded text: the encoding of its bytes from offset k, in whole groups."""
    raw = canary.encode()
    found = [raw]
    for k in range(3):
        part = raw[k : k + 3 * ((len(raw) - k) // 3)]
        found += [base64.b64encode(part), base64.urlsafe_b64encode(part)]
    return found


def hits(data: bytes | str, canaries: dict[str, str]) -> list[str]:
    blob = data.encode(errors="replace") if isinstance(data, str) else data
    return [name for name, canary in canaries.items() if any(e in blob for e in _encodings(canary))]


def scan_files(files: Iterable[Path], canaries: dict[str, str], since: float = 0.0) -> dict[str, list[str]]:
    found = {}
    for path in files:
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= since:
                names = hits(path.read_bytes(), canaries)
                if names:
                    found[str(path)] = names
    return found


class CommandLines(threading.Thread):
    """Samples every process's command line until stopped; remembers each one holding a canary."""

    def __init__(self, canaries: dict[str, str]):
        super().__init__(daemon=True)
        self.canaries = canaries
        self.found: dict[int, tuple[list[str], str]] = {}
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(0.2)

    def sample(self) -> None:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    raw = Path(f"/proc/{entry}/cmdline").read_bytes()
                    names = hits(raw, self.canaries)
                    if names:
                        self.found[int(entry)] = (names, raw.replace(b"\0", b" ").decode(errors="replace")[:300])
        self.samples += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def checked(df, api_token: str):
    """A transform that passes its rows on after checking what it was given: the secret-keyed
    argument, and the Spark settings that must reach the JVM's Hadoop configuration although
    they are kept off its command line."""
    assert api_token == os.environ["LEAK_API_TOKEN"], "the transform's api_token is not the one configured"
    hadoop = df.sparkSession.sparkContext._jsc.hadoopConfiguration()
    for key in SPARK_SECRETS:
        got = hadoop.get(key.removeprefix("spark.hadoop."))
        assert got == os.environ[_var("spark", key)], f"{key} did not reach Hadoop's configuration"
    return df


def _eos(*args: str) -> tuple[int, str]:
    """An eos command in this process; its exit code and everything it printed (or raised)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = eos_main(list(args))
        except BaseException as exc:  # what a user would see is what is scanned
            code = getattr(exc, "code", 1) if isinstance(exc, SystemExit) else 1
            out.write("".join(traceback.format_exception(exc)))
    return code, out.getvalue()


def _start_eos(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "eos", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
        start_new_session=True,
    )


class Output(threading.Thread):
    """Collects a process's output while it runs."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []
        self.start()

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _listening(port: int) -> list[str]:
    """The local addresses a TCP socket listens on at `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


def _wait(check, timeout: float, what: str, proc: subprocess.Popen | None = None, output: Output | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.3)
    tail = output.text[-4000:] if output else ""
    raise AssertionError(f"{what} (exit code {proc.poll() if proc else None}):\n{tail}")


@pytest.fixture
def pg_role(postgres: str):
    """A role of its own, with a schema it owns: (its dsn fields but the password, a function that
    sets its password)."""
    fields = conninfo_to_dict(postgres)
    admin = make_conninfo(**{**fields, "user": "postgres"})
    role = f"leak_{uuid.uuid4().hex[:8]}"

    def set_password(password: str) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(role), sql.Identifier(role)))
    yield {**{k: v for k, v in fields.items() if k != "password"}, "user": role}, set_password
    with psycopg.connect(admin, autocommit=True) as conn:
        for gid in [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE owner = %s", [role])]:
            conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def leak_pipeline(name: str, bootstrap: str, topics: dict[str, str], pg: dict, checkpoint: Path) -> dict:
    def kafka_config(place: str) -> dict[str, str]:
        return {key: f"${{{_var(place, key)}}}" for key in KAFKA_SECRETS}

    schema = pg["user"]
    dsn = make_conninfo(**{**pg, "password": "PGPASSWORD_PLACEHOLDER"}).replace(
        "PGPASSWORD_PLACEHOLDER", "${LEAK_PG_PASSWORD}"
    )
    return {
        "name": name,
        "checkpoint": str(checkpoint),
        "epochs": {"trigger": "available-now", "slots": 2, "timeout": "60s"},
        "sources": [
            {
                "name": "events",
                "kafka": {
                    "bootstrap": bootstrap,
                    "topics": [topics["in"]],
                    "max_records_per_epoch": PER_EPOCH,
                    "config": kafka_config("source"),
                },
                "key_format": "string",
                "value_format": "string",
                "on_error": "dlq",
                "dlq_topic": topics["dlq"],
            }
        ],
        "transforms": [
            {
                "name": "checked",
                "python": "tests.integration.test_no_secret_leaks:checked",
                "input": "events",
                "args": {"api_token": "${LEAK_API_TOKEN}"},
            }
        ],
        "sinks": [
            {
                "name": "out",
                "kafka": {"bootstrap": bootstrap, "topic": topics["out"], "config": kafka_config("sink")},
                "key": "key",
                "value": "value",
                "value_format": "string",
            },
            {
                "name": "db",
                "postgres": {
                    "dsn": dsn,
                    "table": f"{schema}.out",
                    "ledger_table": f"{schema}.eos_ledger",
                    "create_table": True,
                    "columns": {"id": "value"},
                },
            },
        ],
        "spark": {"conf": {key: f"${{{_var('spark', key)}}}" for key in SPARK_SECRETS}},
    }


def _count(dsn: str, table: str) -> int:
    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table.split(".")))).fetchone()[0]
    return 0


def test_no_canary_anywhere_after_a_crash_and_recovery(
    kafka, bootstrap, new_topic, pg_role, tmp_path, monkeypatch
) -> None:
    """The second run has new credentials everywhere (the PostgreSQL role's password changed
    meanwhile): a rotation is not a config change, although the epoch it replays was decided."""
    started = time.time()
    pg, set_pg_password = pg_role
    first, second = make_canaries(), make_canaries()  # run 1's credentials, then rotated ones
    set_pg_password(first["LEAK_PG_PASSWORD"])
    canaries = {**{f"{k} (run 1)": v for k, v in first.items()}, **{f"{k} (run 2)": v for k, v in second.items()}}
    topics = {"in": new_topic(2), "out": new_topic(2), "dlq": f"leak-dlq-{uuid.uuid4().hex[:8]}"}
    produce_numbered(bootstrap, topics["in"], 0, RECORDS)
    checkpoint = tmp_path / "checkpoint"
    name = f"leak-{uuid.uuid4().hex[:8]}"
    path = write_pipeline(tmp_path, leak_pipeline(name, bootstrap, topics, pg, checkpoint))
    assert not hits(path.read_text(), canaries), "the test's pipeline file itself holds a secret"

    sampler = CommandLines(canaries)
    sampler.start()
    outputs: dict[str, str] = {}
    try:
        # Run 1: killed (kill -9 of the driver's process group) once epoch 1's commit is decided.
        crash = _start_eos("run", str(path), "--failpoint", "sink.after_agreement=kill@epoch=1", env=first)
        crashed = Output(crash)
        crash.wait(timeout=300)
        crashed.join(10)
        outputs["run 1 (killed)"] = crashed.text
        assert crash.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), crashed.text[-4000:]

        # Run 2, with every credential rotated: recovers and catches up, serving its metrics,
        # until stopped with SIGTERM.
        set_pg_password(second["LEAK_PG_PASSWORD"])
        for variable, canary in second.items():
            monkeypatch.setenv(variable, canary)  # for the commands run in this process
        pg_dsn = make_conninfo(**{**pg, "password": second["LEAK_PG_PASSWORD"]})
        recovery = _start_eos("run", str(path), "--trigger", "500ms", "--metrics-port", "0", env=second)
        recovered = Output(recovery)
        try:
            port = int(
                _wait(
                    lambda: (m := re.search(r"metrics of \S+ at http://\S+?:(\d+)/metrics", recovered.text))
                    and m.group(1),
                    240, "run 2 never served its metrics", recovery, recovered,
                )
            )  # fmt: skip
            _wait(lambda: _count(pg_dsn, f"{pg['user']}.out") >= RECORDS, 240, "run 2 did not catch up", recovery,
                  recovered)  # fmt: skip
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                outputs["/metrics"] = response.read().decode()
            assert "eos_" in outputs["/metrics"]
            bound = _listening(port)
            outputs["eos status"] = _eos("status", str(path))[1]
            outputs["eos status --json"] = _eos("status", "--json", "--no-txns", str(path))[1]
        finally:
            recovery.send_signal(signal.SIGTERM)
            try:
                recovery.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(recovery.pid, signal.SIGKILL)
                recovery.wait()
            recovered.join(10)
            outputs["run 2 (recovery)"] = recovered.text
    finally:
        sampler.stop()
    assert recovery.returncode == 0, recovered.text[-4000:]
    assert sampler.samples > 10, "the command lines were hardly sampled"
    assert _count(pg_dsn, f"{pg['user']}.out") == RECORDS, "the table does not hold every record exactly once"
    assert_exactly_once([f"rec-{i}" for i in range(RECORDS)], committed_values(bootstrap, topics["out"]))

    code, outputs["eos validate --json"] = _eos("validate", "--json", str(path))
    assert code == 0, outputs["eos validate --json"]

    # The error of a wrong password, as `eos status` and the sink's own connection report it.
    wrong = dict(leak_pipeline(name, bootstrap, topics, pg, checkpoint))
    wrong["sinks"][1]["postgres"]["dsn"] = wrong["sinks"][1]["postgres"]["dsn"].replace(
        "${LEAK_PG_PASSWORD}", "${LEAK_PG_WRONG}"
    )
    wrong_path = write_pipeline(tmp_path, wrong, "wrong.yaml")
    outputs["eos status, wrong password"] = _eos("status", "--no-txns", str(wrong_path))[1]
    assert "password authentication failed" in outputs["eos status, wrong password"]
    config = load_pipeline(wrong_path)
    sink = connectors(config, pipeline_info(config, "x", tmp_path)).sinks[1]
    with pytest.raises(Exception) as raised:  # whichever error it is, its text is scanned
        sink.check(None)
    outputs["error of a wrong password"] = "".join(traceback.format_exception(raised.value)) + repr(raised.value)
    assert "password authentication failed" in outputs["error of a wrong password"]

    found = {where: names for where, text in outputs.items() if (names := hits(text, canaries))}
    found.update(scan_files(checkpoint.rglob("*"), canaries))
    broker = getattr(kafka, "broker", None)
    if broker is not None:  # the local broker: its log and its topics' data
        found.update(scan_files(Path(broker.data_dir).rglob("*"), canaries, since=started))
    else:
        print(f"(the broker under test is {kafka.kind}: its folder is not on this machine and was not scanned)")
    found.update({f"pid {pid}: {cmd}": names for pid, (names, cmd) in sampler.found.items()})
    assert (checkpoint / "_eos" / "pipeline.json").exists()
    assert not found, "secrets leaked:\n" + "\n".join(f"  {where}: {names}" for where, names in found.items())
    # The metrics endpoint listens on loopback unless told otherwise (metrics.host, --metrics-host).
    assert bound and set(bound) <= {"0100007F", "00000000000000000000000001000000"}, bound


def test_the_errors_of_a_wrong_kafka_password_do_not_show_it(secure_kafka, unique_name, tmp_path, monkeypatch, caplog):
    """On the secured broker (SASL_SSL, SCRAM-SHA-512): the start-up checks of a source and a
    sink whose Kafka password is wrong fail, and neither their errors nor anything logged
    meanwhile shows the password. (The right password reaches the broker: the failure is the
    password's.)"""
    from eos_connectors.kafka.clients import admin_client

    user = unique_name("leak")
    settings = secure_kafka.settings(user)  # a real user, whose real password the pipeline lacks
    assert admin_client(settings).list_topics(timeout=30).brokers
    wrong = make_canaries()["LEAK_PG_WRONG"].replace("Pg", "Kafka")
    monkeypatch.setenv("LEAK_KAFKA_WRONG", wrong)
    monkeypatch.setenv("EOS_STARTUP_ATTEMPTS", "1")
    client = {k: v for k, v in settings.items() if k != "bootstrap.servers"} | {"sasl.password": "${LEAK_KAFKA_WRONG}"}
    kafka = {"bootstrap": secure_kafka.bootstrap, "config": client}
    config = {
        "name": unique_name("p"),
        "checkpoint": str(tmp_path / "checkpoint"),
        "sources": [{"name": "events", "kafka": {**kafka, "topics": ["t"]}}],
        "sinks": [{"name": "out", "kafka": {**kafka, "topic": "o"}}],
    }
    loaded = load_pipeline(write_pipeline(tmp_path, config))
    found = connectors(loaded, pipeline_info(loaded, "x", tmp_path))
    outputs = {}
    for connector in (found.sources[0], found.sinks[0]):
        with pytest.raises(Exception) as raised:  # whichever error it is, its text is scanned
            connector.check(None)
        outputs[f"{connector.name}: check"] = "".join(traceback.format_exception(raised.value))
    outputs["logged"] = caplog.text
    found_in = {what: hits(text, {"LEAK_KAFKA_WRONG": wrong}) for what, text in outputs.items()}
    assert not any(found_in.values()), found_in


# ---------------------------------------------------------------------------------------------
# Without servers
# ---------------------------------------------------------------------------------------------

# Every setting whose value is a secret: librdkafka's (the properties it flags as sensitive and
# that hold a secret, not a path or a name), Spark's and Hadoop's, libpq's.
SECRET_SETTINGS = (
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem", "ssl_key",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.jaas.config", "spark.authenticate.secret", "spark.ssl.keyPassword", "spark.ssl.keyStorePassword",
    "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.session.token",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
    "spark.hadoop.fs.gs.auth.service.account.private.key",
    "password", "sslpassword", "api_token", "apiKey", "accessToken", "basic.auth.user.info",
)  # fmt: skip
# Settings that look close but hold no secret: shown as they are.
PLAIN_SETTINGS = (
    "bootstrap.servers", "sasl.username", "sasl.mechanism", "ssl.key.location", "ssl.ca.location",
    "ssl.keystore.location", "key", "key_format", "topic", "tokenizer", "spark.authenticate",
    "spark.hadoop.fs.s3a.endpoint", "fs.azure.account.keyprovider", "transactional_id_prefix",
)  # fmt: skip


def test_the_mask_covers_every_secret_setting() -> None:
    config = {key: f"value-of-{key}" for key in (*SECRET_SETTINGS, *PLAIN_SETTINGS)}
    shown = redacted(config)
    assert [k for k in SECRET_SETTINGS if shown[k] != "***"] == []
    assert [k for k in PLAIN_SETTINGS if shown[k] != config[k]] == []
    # Secrets inside a value: a connection string's password, a URL's user:password.
    values = {
        "dsn": "host=db port=5432 user=eos password=Canary1 sslmode=require",
        "quoted": "host=db password='Canary 2' dbname=x",
        "uri": "postgresql://eos:Canary3@db:5432/x?sslmode=require",
        "registry": "https://user:Canary4@registry:8081",
        "jdbc": "jdbc:postgresql://db/x?user=eos&password=Canary5&ssl=true",
    }
    masked = redacted(values)
    assert not any("Canary" in v for v in masked.values()), masked
    assert masked["uri"].startswith("postgresql://eos:") and "@db:5432/x" in masked["uri"]
    assert "host=db" in masked["dsn"] and "sslmode=require" in masked["dsn"]


def test_reprs_of_what_carries_client_settings_show_no_secret() -> None:
    canaries = make_canaries()
    client = {"bootstrap.servers": "127.0.0.1:9092", **{k: canaries[_var("source", k)] for k in KAFKA_SECRETS}}
    shown = {
        "ReaderOptions": repr(ReaderOptions("events", client, ["t"], {}, {}, 2, "fail")),
        "KafkaWriterFactory": repr(KafkaWriterFactory("out", "t", client, "eos/p", "ledger", True, 60.0, {})),
        "KafkaControlLog": repr(KafkaControlLog(client, "ledger.control", "p")),
    }
    config = parse_pipeline(
        yaml_text(client["sasl.password"], canaries["LEAK_PG_PASSWORD"], canaries["LEAK_API_TOKEN"])
    )
    shown["PipelineConfig"] = repr(config) + str(config)
    shown["a sink entry"] = repr(config.sinks[1]) + repr(config.sinks[1].postgres)
    leaked = {what: hits(text, canaries) for what, text in shown.items() if hits(text, canaries)}
    assert not leaked, leaked
    for what in ("ReaderOptions", "KafkaWriterFactory", "KafkaControlLog", "PipelineConfig"):
        assert "127.0.0.1:9092" in shown[what], f"{what}: {shown[what]}"  # still useful to read
    assert "host=127.0.0.1 dbname=x user=eos" in shown["a sink entry"]


def yaml_text(kafka_password: str, pg_password: str, token: str, scale: str = "1") -> str:
    return f"""
name: p
checkpoint: /tmp/never-written
sources:
  - name: events
    kafka: {{bootstrap: "127.0.0.1:9092", topics: [t], config: {{sasl.password: "{kafka_password}"}}}}
transforms:
  - name: scaled
    python: eos.transforms:drop_duplicates
    args: {{columns: [key], api_token: "{token}", scale: "{scale}"}}
sinks:
  - name: out
    kafka: {{bootstrap: "127.0.0.1:9092", topic: o, config: {{sasl.password: "{kafka_password}"}}}}
  - name: db
    postgres: {{dsn: "host=127.0.0.1 dbname=x user=eos password={pg_password}", table: t}}
  - name: lake
    delta: {{table: "s3://b/t", storage_options: {{AWS_SECRET_ACCESS_KEY: "{token}"}}}}
spark:
  conf: {{spark.hadoop.fs.s3a.secret.key: "{token}"}}
"""


def test_credentials_are_not_part_of_the_replay_config() -> None:
    """What a replay must repeat holds no credential (it is pinned in the checkpoint), and new
    credentials (a rotated password) leave its digest as it was: no refused restart."""

    def replay(text: str) -> dict:
        config = parse_pipeline(text)
        return replay_config(config, connectors(config, pipeline_info(config, "x", None)), 2)

    first = replay(yaml_text("CanaryKafka1", "CanaryPg1", "CanaryToken1"))
    rotated = replay(yaml_text("CanaryKafka2", "CanaryPg2", "CanaryToken2"))
    assert "Canary" not in json.dumps(first), json.dumps(first)
    assert digest(first) == digest(rotated)
    # Where each sink writes is in it: the topic, the table, the Delta table's location.
    sinks = {sink["name"]: sink for sink in first["sinks"]}
    assert (sinks["out"]["kafka"]["topic"], sinks["db"]["postgres"]["table"]) == ("o", "t")
    assert sinks["lake"]["delta"]["table"] == "s3://b/t" and "storage_options" not in sinks["lake"]["delta"]
    # Anything else still counts: the digest is not blind.
    assert digest(replay(yaml_text("CanaryKafka1", "CanaryPg1", "CanaryToken1", scale="2"))) != digest(first)


def test_a_secret_from_the_environment_arrives_as_written() -> None:
    """`${VAR}` is where secrets live; a password is text, never YAML to parse (it used to be: `a #b`
    arrived as `a`, `'q'` as `q`, and `[x` was a traceback)."""
    for password in ("a #b", "'q'", "[x", "{y: z", "p@ss:w rd", "!!binary x"):
        config = parse_pipeline(yaml_text("${PW}", "x", "t"), env={"PW": password})
        assert config.sources[0].kafka.config["sasl.password"] == password
