"""PySpark's worker daemon (`pyspark.daemon`), without its tracebacks for a JVM that hung up.

Spark runs `python -m <spark.python.daemon.module>` to fork its Python workers. When the JVM side
closes a worker's connection (a task finished after its result was taken, a worker released at the
end of a query or at a stop), the worker's last flush finds the socket closed, and PySpark's daemon
prints a BrokenPipeError traceback on the driver's stderr, several per run. Nobody can act on it:
the worker was done, and the JVM reports a worker that failed a task by itself. eos sets
`spark.python.daemon.module` to this module, which runs PySpark's own daemon with the worker
function wrapped: a connection the peer closed ends the worker quietly; anything else is PySpark's
to report, as before.
"""

from __future__ import annotations

from typing import Any


def main() -> None:
    import pyspark.daemon as daemon

    serve = daemon.worker

    def worker(sock: Any, authenticated: bool) -> int:
        try:
            return serve(sock, authenticated)
        except (BrokenPipeError, ConnectionResetError):
            return 1  # the JVM hung up: the manager closes this worker without a traceback

    daemon.worker = worker
    daemon.manager()


if __name__ == "__main__":
    main()
