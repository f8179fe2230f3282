"""When Spark's driver JVM is told to stop (SIGTERM, Ctrl-C), eos stops first.

A JVM that receives SIGTERM or SIGINT runs its shutdown hooks, and Spark's stops the SparkContext
under whatever still runs. Under `spark-submit` the JVM is the process the user started (the one
`kill`, `docker stop` or Kubernetes signals), and Ctrl-C or a process-group kill reaches it and
the Python driver at once: the SparkContext stopped while eos was finishing its epoch, and the
query ended with `ERROR MicroBatchExecution: Query ... terminated with error ... RpcEnv already
stopped` (and eos, at best, with "Spark stopped on its own"), although nothing was lost. An `eos
run` whose JVM eos started meets the same race when the whole process group is signalled.

So every JVM eos builds a session in gets one more hook, run before Spark's (Hadoop's
ShutdownHookManager runs its hooks one after the other, highest priority first; Spark's, which
stops the SparkContext, has priority 40): it calls back into the driver, which stops every
running eos query the way SIGTERM does (the epoch in flight commits, or stays pending for the
next start; no new one starts), and the JVM waits for that, at most `WAIT_S`. A driver that
already got the signal itself is stopping anyway: the second stop just waits for the first.
When the driver's own process ends first, the hook is removed (atexit); if the JVM is shutting
down by then (a signal reached both), the driver waits for the hook's call to return before it exits.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from typing import Any, ClassVar

log = logging.getLogger("eos.jvmstop")

PRIORITY = 100  # above Spark's 40: runs before the SparkContext stops
WAIT_S = 300  # the longest the JVM waits for the driver's stop (an epoch's timeout, its commit)
CALL_WAIT_S = 5.0  # a driver done first waits this long for the call of a JVM shutting down...
REPLY_S = 0.5  # ...and this long after it returned, for its reply to reach the JVM

_registered: dict[int, Any] = {}  # id(gateway) -> the hook, once per JVM


class _StopEosFirst:
    """The hook's body, a java.lang.Runnable the JVM calls over py4j's callback server."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.returned = threading.Event()

    def run(self) -> None:
        from eos.query import running

        self.called.set()
        try:
            queries = running()
            if queries:
                print(
                    "eos: Spark's JVM is shutting down: finishing the current epoch, then stopping",
                    file=sys.stderr,
                    flush=True,
                )
            for query in queries:
                query.stop()
        except Exception:  # the JVM goes on with its own hooks whatever happens here
            log.exception("stopping before Spark's JVM")
        finally:
            self.returned.set()

    class Java:
        implements: ClassVar[list[str]] = ["java.lang.Runnable"]


def stop_eos_first(spark: Any) -> None:
    """Add the hook to the JVM of `spark` (once per JVM)."""
    from pyspark.java_gateway import ensure_callback_server_started

    context = spark.sparkContext
    gateway = context._gateway
    if id(gateway) in _registered:
        return
    ensure_callback_server_started(gateway)
    jvm = context._jvm
    # A Java object of its own around the callback: the one reference removeShutdownHook needs.
    body = _StopEosFirst()
    hook = jvm.java.lang.Thread(body, "eos-stop-first")
    manager = jvm.org.apache.hadoop.util.ShutdownHookManager.get()
    manager.addShutdownHook(hook, PRIORITY, WAIT_S, jvm.java.util.concurrent.TimeUnit.SECONDS)
    _registered[id(gateway)] = (hook, body)

    def remove() -> None:
        # The driver ends first: a hook calling back into a process that is gone would fail (and
        # the JVM would log that it did). If the JVM's shutdown has begun (a signal reached both),
        # the call is coming or running: the driver waits for it to return before it exits.
        try:
            if not manager.isShutdownInProgress():
                manager.removeShutdownHook(hook)
                return
        except Exception:  # the JVM or the gateway is gone already
            return
        if body.called.wait(CALL_WAIT_S) and body.returned.wait(WAIT_S):
            time.sleep(REPLY_S)  # py4j writes the reply after run() returned

    atexit.register(remove)
