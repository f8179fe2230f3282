"""`eos demo`: the README's run command.

Until the pipeline runner exists this is a smoke job: it starts the local broker, commits one
transaction and aborts another, and shows that a read_committed reader sees exactly the first.
"""

from __future__ import annotations

import sys
import uuid

from connectors.kafka_clients import admin_client, consumer, create_topic, end_offsets, producer
from connectors.range_reader import read_range
from eos.localkafka import LocalBroker


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_smoke(port: int = 9092) -> int:
    broker = LocalBroker(port=port)
    broker.start(progress=_say)
    topic = f"eos-smoke-{uuid.uuid4().hex[:8]}"
    config = {"bootstrap.servers": broker.bootstrap}
    admin = admin_client(config)
    create_topic(admin, topic)
    txn = producer({**config, "transactional.id": f"eos-smoke-{uuid.uuid4().hex[:8]}"})
    txn.init_transactions(30)
    for outcome in ("commit", "abort"):
        txn.begin_transaction()
        for i in range(5):
            txn.produce(topic, value=f"{outcome}-{i}".encode())
        txn.flush(30)
        txn.commit_transaction(30) if outcome == "commit" else txn.abort_transaction(30)
    seen = {}
    for isolation in ("read_committed", "read_uncommitted"):
        end = end_offsets(admin, {topic: [0]}, read_committed=isolation == "read_committed")[(topic, 0)]
        reader = consumer({**config, "isolation.level": isolation})
        seen[isolation] = [m.value().decode() for batch in read_range(reader, topic, 0, 0, end) for m in batch]
        reader.close()
    ok = seen["read_committed"] == [f"commit-{i}" for i in range(5)] and len(seen["read_uncommitted"]) == 10
    print(
        f"read_committed saw {len(seen['read_committed'])} records, read_uncommitted saw "
        f"{len(seen['read_uncommitted'])}: {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1
