"""One driver per pipeline: where its vote service listens, and how a new driver takes the
pipeline over from the last one (asking it first whether it still runs, then fencing it).
Fencing, through the driver's transactional id in the control log, is what keeps two drivers from
both committing; asking first turns an accidental second start into a clear error."""

from __future__ import annotations

import sys
import time
from typing import Any

from eos.config import PipelineHeader
from eos.errors import CheckpointError, ConfigError
from eos.protocol.channel import Liveness, ping
from eos.protocol.coordinator import Coordinator
from eos.protocol.decision import ControlLog, ControlState, DriverInfo


def take_over(control: ControlLog, driver: DriverInfo, allow: bool) -> ControlState:
    """Refuse to start while another driver of this pipeline answers (unless told to fence it);
    then fence every earlier driver. Fencing is what keeps two drivers from both committing;
    asking first turns an accidental second start into a clear error instead of a takeover."""
    previous = control.previous_driver()
    if previous is not None and previous.run != driver.run and not allow:
        # Only the recorded driver can prove it answers (its ping key, pipeline and run): another
        # pipeline's vote service on a reused port, or any other process there, does not count.
        answer = ping(previous)
        if answer is Liveness.ALIVE:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(previous.started_at))
            raise CheckpointError(
                f"another eos driver is running this pipeline: pid {previous.pid} on {previous.host} (vote service "
                f"{previous.address}, started {started}). Two drivers must never run one pipeline.",
                hint="stop it first; or, if it is a stale process you cannot reach, start with --take-over (the "
                "old driver is fenced: it can no longer commit and stops at its next epoch)",
            )
        if answer is Liveness.OTHER:
            earlier = "" if previous.ping_key else " (or it is a driver of an earlier eos, which cannot prove it)"
            print(
                f"eos: the last driver's vote service address {previous.address} answers, but not as that driver (pid "
                f"{previous.pid} on {previous.host}, run {previous.run}): another process holds the port now, such as "
                f"another pipeline's vote service{earlier}; taking the pipeline over",
                file=sys.stderr,
                flush=True,
            )
    return control.take_over(driver)


def coordinator_for(config: PipelineHeader, spark: Any, identity: dict[str, Any], slots: int = 0) -> Coordinator:
    """The vote service listens only where the executors reach it: `coordinator.host`, else the
    driver's host (127.0.0.1 for a local master, else spark.driver.host). Like Spark's own driver,
    it binds to spark.driver.bindAddress instead when that is set (a driver behind NAT or in a
    container, whose advertised name is not an address of its own)."""
    local = spark.sparkContext.master.startswith("local")
    host = config.coordinator.host
    if host is None:
        host = "127.0.0.1" if local else spark.conf.get("spark.driver.host")
    bind = host if local else (spark.conf.get("spark.driver.bindAddress", None) or host)
    port = config.coordinator.port
    try:
        return Coordinator(bind_host=bind, port=port, advertise_host=host, identity=identity, slots=slots)
    except OSError as exc:
        raise ConfigError(
            f"the vote service cannot listen on {bind}:{port}: {exc}",
            hint="set coordinator.host to an address of this machine that the executors reach (or "
            "spark.driver.bindAddress, if the driver's advertised host is not one), and coordinator.port to a free "
            "port or 0",
        ) from None
