"""`eos run` shows only eos's lines: py4j's report of a call whose connection broke (it logs that on
the root logger, as when the driver's exit handlers call a JVM that is already gone) is dropped,
like everything py4j logs on its own logger."""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading

import pytest
from py4j.java_gateway import GatewayClient
from py4j.protocol import Py4JNetworkError

from eos.cli import py4j_on_root


def _broken_gateway() -> tuple[socket.socket, int]:
    """A port that accepts each connection and closes it at once (a JVM going away)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("filtered", [True, False])
def test_py4js_report_of_a_broken_call_on_the_root_logger_is_dropped(filtered):
    server, port = _broken_gateway()
    shown = io.StringIO()
    handler = logging.StreamHandler(shown)
    if filtered:
        handler.addFilter(py4j_on_root)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.suppress(Py4JNetworkError):  # it raises, or answers with the error
            GatewayClient(port=port).send_command("c\nt\nisShutdownInProgress\ne\n")
        logging.getLogger("eos.test").error("an error of eos's own")
    finally:
        root.removeHandler(handler)
        server.close()
    assert "an error of eos's own" in shown.getvalue()  # the filter keeps everything else
    assert ("Exception while sending command" in shown.getvalue()) is not filtered
