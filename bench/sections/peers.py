"""8. Peers: the same pipelines on Quix Streams (exactly-once) and Kafka Streams (exactly_once_v2).

Paired rounds of eos exactly-once, Quix Streams and Kafka Streams on the same input, the order
rotated per round (bench/peers has how each peer is set up and what differs). The stateless
pipeline reads the throughput section's 4-partition input; the stateful one a 1-partition input
of the same events, because the peers keep event time per partition where Spark keeps one
watermark per query: on several partitions read as a backlog their output differs from eos's
(bench/peers/__init__.py); on one partition all three output exactly the ground truth.

Rates: eos's is input records / wall time of `run_config` on the warm SparkSession (query start,
recovery and the last commit included, JVM start-up not); a peer's is input records / its
processing time, first record to last commit (interpreter or JVM start-up, imports and the group
join not included; its wall-time rate, start-up included, is kept beside it). CPU per record is
every process of ours (driver or peer, Spark's JVM and Python workers, the broker) from /proc,
over the whole run, and the peer's own CPU from its first record to its last commit.
"""

from __future__ import annotations

from typing import Any

from bench.context import Bench
from bench.inputs import count_records, delete_topics
from bench.pipelines import unique
from bench.runs import EO, brief, cpu_per_record, measure, warm_up

QUIX, KSTREAMS = "Quix Streams exactly-once", "Kafka Streams exactly_once_v2"
CONFIGS = (EO, QUIX, KSTREAMS)
PIPELINES = (("stateless", None), ("stateful", 1))  # (pipeline, input partitions: None = the plan's)


def run_peer(bench: Bench, config: str, pipeline: str, source: Any) -> dict[str, Any]:
    from bench.peers import run_kstreams, run_quix

    name = unique(f"bench-{pipeline}-{'quix' if config == QUIX else 'kstreams'}")
    out_topic = f"{name}-out"
    common = {
        "records": source.records,
        "partitions": source.partitions,
        "pipeline": pipeline,
        "broker_pid": bench.broker_pid,
        "work_dir": bench.work,
        "progress": bench.say,
    }
    if config == QUIX:
        extra = {"expected_out": source.windows_expected} if pipeline == "stateful" else {}
        peer = run_quix(bench.bootstrap, source.topic, out_topic, **common, **extra)
    else:
        peer = run_kstreams(bench.bootstrap, source.topic, out_topic, **common)
    peer["records_out_counted"] = count_records(bench.bootstrap, out_topic)
    delete_topics(bench.bootstrap, [out_topic])
    rate = peer.get("rps_processing") or peer["rps_wall"]
    row = {
        "config": config,
        "pipeline": pipeline,
        "records_in": source.records,
        "partitions": source.partitions,
        "wall_s": peer["processing_s"] or peer["wall_s"],
        "rps_wall": rate,  # the rate every ratio uses (see the module docstring)
        "rps_process_wall": peer["rps_wall"],
        "records_out": peer["records_out_counted"],
        "cpu": peer["cpu"],
        "peer": peer,
        "epochs": [],
        "epoch_time_s": None,
    }
    row["cpu_us_per_record"] = cpu_per_record(row)
    row["peer_cpu_us_per_record"] = peer.get("processing_cpu_us_per_record")
    return row


def run(bench: Bench) -> dict[str, Any]:
    from bench.peers import kstreams_classpath, quix_python

    plan = bench.plan
    warm_up(bench)
    bench.say("peers: installing Quix Streams (own venv) and building the Kafka Streams app (cached) ...")
    quix_python(bench.say)
    kstreams_classpath(bench.say)
    result: dict[str, Any] = {"epoch_records": plan.epoch_records, "pipelines": {}}
    for pipeline, partitions in PIPELINES:
        source = bench.input(plan.events, partitions or plan.partitions)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for round_no in range(plan.rounds):
            order = CONFIGS[round_no % len(CONFIGS) :] + CONFIGS[: round_no % len(CONFIGS)]
            for config in order:
                bench.say(f"peers {pipeline}: round {round_no + 1}/{plan.rounds}: {config} ...")
                if config == EO:
                    row = measure(bench, pipeline, EO, source, plan.epoch_records)
                else:
                    row = run_peer(bench, config, pipeline, source)
                row["round"] = round_no
                runs[config].append(row)
                bench.say(f"peers {pipeline}: round {round_no + 1}/{plan.rounds}: {config}: {brief(row)}")
        result["pipelines"][pipeline] = {"input": source.__dict__, "runs": runs}
    return result
