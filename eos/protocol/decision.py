"""The commit decision, recorded durably before anything commits, by one driver at a time.

The control log is where a driver (1) takes a pipeline over, fencing every earlier driver, and
(2) records, for each epoch attempt, "commit" before telling any slot to commit. A connector
provides it (the Kafka connector keeps it in the ledger topic, written through a transactional
producer whose id is the pipeline's driver id: `init_transactions` by a new driver fences the
old one, so the old driver's next decision fails and it stops).

Why the decision must be durable and fenced:
- A sink that can commit a prepared transaction from anywhere (PostgreSQL) is *resumed* after a
  crash: recovery commits exactly the prepared transactions of the recorded decision and rolls
  back every other one. Without a durable decision it could not tell "all slots agreed" from
  "some slot never prepared".
- Two live drivers (a failover while the old one still runs, a restored backup started twice):
  a driver whose skip set is stale writes an epoch again, but it can no longer record a
  decision once a newer driver took over, so nothing it wrote is ever committed.

Records written here: the driver that took over (host, pid, vote-service address, and the key
with which that service proves it is this driver: a new driver first asks it whether it is still
alive), the decision of each epoch attempt, and the size of each sink's pool of transactional ids
(so recovery can fence all of them).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DriverInfo:
    run: str  # random id of one driver process's run
    host: str
    pid: int
    address: str  # host:port of its vote service
    started_at: float = field(default_factory=time.time)
    pipeline: str = ""
    # The secret with which its vote service proves it is this driver when pinged
    # (eos.protocol.channel.ping). It opens nothing: it can only make a new driver wait.
    ping_key: str = field(default="", repr=False)
    # The checkpoint it runs the pipeline on: a pipeline's name belongs to one checkpoint, and a
    # copy of its file with a new checkpoint must take a name of its own (eos.launch).
    checkpoint_id: str = ""
    checkpoint: str = ""  # its location, for the message that names it


@dataclass(frozen=True)
class Decision:
    """Epoch `epoch`, attempt `attempt` of run `run` commits exactly `prepared`: handles of the
    slots' pre-committed transactions, by sink."""

    epoch: int
    attempt: int
    run: str
    prepared: dict[str, list[str]]
    decided_at: float = field(default_factory=time.time)

    def commits(self, sink: str, handle: str) -> bool:
        return handle in self.prepared.get(sink, ())


@dataclass(frozen=True)
class Pool:
    """A sink's pool of transactional identities: ids 0..size-1 have been handed out. Kept for
    every sink that ever had one, configured or not any more: recovery fences them all (a sink
    renamed while its transactions were open must not leave them pinning its topics)."""

    size: int
    kind: str  # the sink's connector kind
    system: str  # SinkConnector.system(): which cluster (recovery fences there)
    detail: dict[str, Any] = field(default_factory=dict)  # the connector's (e.g. the id prefix)


@dataclass
class ControlState:
    """What the control log held when this driver took over."""

    previous: DriverInfo | None = None
    decision: Decision | None = None
    pools: dict[str, Pool] = field(default_factory=dict)  # by sink name


class ControlLog(ABC):
    """Driver-side; provided by a connector (see module doc)."""

    @abstractmethod
    def state(self) -> ControlState:
        """What the log holds now, read without taking anything over (and without creating it)."""

    def previous_driver(self) -> DriverInfo | None:
        """The last driver that took the pipeline over (to ask whether it still runs)."""
        return self.state().previous

    def decision(self) -> Decision | None:
        """The last recorded decision (what recovery resumes)."""
        return self.state().decision

    @abstractmethod
    def take_over(self, driver: DriverInfo) -> ControlState:
        """Fence every earlier driver, record this one, return the state before it."""

    @abstractmethod
    def record_decision(self, decision: Decision) -> None:
        """Durably record a commit decision; raises DriverFenced if a newer driver took over."""

    @abstractmethod
    def record_pools(self, pools: dict[str, Pool]) -> None:
        """Durably record the pools before ids beyond their old sizes are used (DriverFenced too)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything (eos reset)."""

    def close(self) -> None:  # noqa: B027 - optional
        pass


def encode(kind: str, value: Any) -> bytes:
    return json.dumps({"kind": kind, **(asdict(value) if hasattr(value, "__dataclass_fields__") else value)}).encode()


def decode(data: bytes) -> tuple[str, dict[str, Any]]:
    value = json.loads(data)
    return value.pop("kind"), value
