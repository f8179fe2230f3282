"""The control log on Kafka (see eos.protocol.decision for what it is for).

Records go to the pipeline's control topic (`<ledger topic>.control`, compacted, one partition,
replicated like the ledger), written only through one transactional producer whose id is the
pipeline's driver id (`eos/<pipeline>/~driver`). `init_transactions` on that id by a new driver
bumps its producer epoch: every write of an older driver fails from then on with a fencing
error, which this module turns into `DriverFenced`.

Why its own topic: recovery must read the control records (how many transactional ids to fence)
*before* it fences the sink slots, and the slots' transactions hold the ledger topic's last
stable offset; only the driver writes here, and a new driver's `init_transactions` has already
ended whatever the old one had open.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict
from typing import Any

from eos.api import (
    ControlLog,
    ControlState,
    Decision,
    DriverFenced,
    DriverInfo,
    EnvironmentProblem,
    Pool,
    Retriable,
    decode,
    encode,
)
from eos_connectors.kafka import access, ids
from eos_connectors.kafka.clients import UnknownTopic, admin_client, is_fenced, is_indefinite, kafka_error, producer
from eos_connectors.kafka.ledger import control_key, ensure_ledger_topic, scan, wait_until_stable

log = logging.getLogger("eos.control")

KINDS = ("driver", "decision", "pools")


class KafkaControlLog(ControlLog):
    def __init__(self, client: dict[str, Any], topic: str, pipeline: str, timeout_s: float = 60.0):
        self.client = client
        self.topic = topic
        self.pipeline = pipeline
        self.timeout_s = timeout_s
        self.txid = ids.driver_id(pipeline)
        self._producer: Any = None
        self._admin: Any = None

    def __repr__(self) -> str:  # never the client's secrets
        return (
            f"KafkaControlLog(pipeline={self.pipeline!r}, topic={self.topic!r}, "
            f"bootstrap={self.client.get('bootstrap.servers')!r})"
        )

    @property
    def admin(self) -> Any:
        """One admin client for every read (a new one connects first: tens of ms each, and a
        start-up reads the log twice). Its answers are not a cache: every read waits until the
        topic is stable."""
        if self._admin is None:
            self._admin = admin_client(self.client)
        return self._admin

    # -- reading -------------------------------------------------------------------------------
    def _read(self, wait_s: float) -> ControlState:
        try:  # one DescribeTopics answers both "does it exist" and "which partitions"
            ends = wait_until_stable(self.client, self.topic, wait_s, self.admin)
        except UnknownTopic:
            return ControlState()  # no driver has taken this pipeline over yet
        latest = scan(self.client, self.topic, ends)
        records: dict[str, dict[str, Any]] = {}
        for kind in KINDS:
            record = latest.get(control_key(self.pipeline, kind))
            if record is not None:
                records[kind] = decode(record[1])[1]
        return ControlState(
            previous=DriverInfo(**records["driver"]) if "driver" in records else None,
            decision=Decision(**records["decision"]) if "decision" in records else None,
            pools={name: Pool(**pool) for name, pool in records.get("pools", {}).get("pools", {}).items()},
        )

    def state(self) -> ControlState:
        return self._read(wait_s=30)

    # -- writing -------------------------------------------------------------------------------
    def take_over(self, driver: DriverInfo) -> ControlState:
        access.check_control(self)  # the ACLs it needs, before it creates or writes anything
        ensure_ledger_topic(self.client, self.topic, self.admin)
        access.check_created(self.client, "control log", self.topic, self.admin)
        self._new_producer()  # fences every earlier driver; aborts what it had open
        state = self._read(wait_s=self.timeout_s)
        self._write("driver", driver)
        return state

    def record_decision(self, decision: Decision) -> None:
        self._write("decision", decision)

    def record_pools(self, pools: dict[str, Pool]) -> None:
        self._write("pools", {"pools": {name: asdict(pool) for name, pool in pools.items()}})

    def reset(self) -> None:
        """Tombstones for this pipeline's records, in one transaction of the driver id this
        (resetting) driver took over: fenced like any write, so a driver that took the pipeline
        over meanwhile keeps its records. The topic stays: `<ledger topic>.control` is shared by
        every pipeline whose ledger topic is."""
        if self._producer is None:
            raise DriverFenced(f"pipeline {self.pipeline}: this driver has not taken the pipeline over")
        instance = self._producer
        try:
            instance.begin_transaction()
            for kind in KINDS:
                instance.produce(self.topic, None, control_key(self.pipeline, kind), partition=0)
            instance.commit_transaction(self.timeout_s)
        except Exception as exc:
            if is_fenced(exc):
                self._producer = None
                raise DriverFenced(
                    f"another eos driver took over pipeline {self.pipeline} during its reset: its control records stay",
                    hint="stop that driver, then run eos reset again",
                ) from None
            with contextlib.suppress(Exception):
                instance.abort_transaction(10)
            raise EnvironmentProblem(
                f"forgetting pipeline {self.pipeline}'s control records failed: {kafka_error(exc) or exc}",
                hint="run eos reset again: it forgets what is left",
            ) from None

    def close(self) -> None:
        self._admin = None
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(5)
            self._producer = None

    def _new_producer(self) -> None:
        self.close()
        instance = producer({**self.client, "transactional.id": self.txid, "linger.ms": 0})
        try:
            instance.init_transactions(self.timeout_s)
        except Exception as exc:
            refused = access.driver_denied(self, exc)
            if refused is not None:
                raise refused from None
            raise EnvironmentProblem(
                f"cannot take over pipeline {self.pipeline} on {self.client.get('bootstrap.servers')}: "
                f"init_transactions({self.txid}) failed: {kafka_error(exc) or exc}"
            ) from exc
        self._producer = instance

    def _write(self, kind: str, value: Any) -> None:
        """One record in its own transaction: durable (acks=all) and fenced by the driver id."""
        if self._producer is None:
            raise DriverFenced(f"pipeline {self.pipeline}: this driver has not taken the pipeline over")
        instance = self._producer
        started = time.monotonic()
        try:
            instance.begin_transaction()
            instance.produce(self.topic, encode(kind, value), control_key(self.pipeline, kind), partition=0)
            instance.commit_transaction(self.timeout_s)
        except Exception as exc:
            error = kafka_error(exc)
            if is_fenced(exc):
                self._producer = None
                raise DriverFenced(
                    f"another eos driver took over pipeline {self.pipeline} (its driver id {self.txid} was fenced): "
                    "this driver stops without committing; the other one carries on",
                    hint="if that was not intended, stop the other driver; `eos status` shows the driver that runs",
                ) from None
            if is_indefinite(exc):
                # The transaction's outcome is unknown, and a delayed request of it must not land in
                # a later one: never reuse this producer (a new init_transactions bumps the epoch).
                self._new_producer()
            else:
                with contextlib.suppress(Exception):
                    instance.abort_transaction(10)
            raise Retriable(
                f"recording the {kind} of pipeline {self.pipeline} failed after {time.monotonic() - started:.1f} s: "
                f"{error or exc}"
            ) from None
