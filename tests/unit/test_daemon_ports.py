"""Ports for the local daemons (Kafka, HDFS, PostgreSQL, the Spark cluster) lie outside the kernel's
ephemeral range. A daemon keeps its port across restarts; while it is down the kernel may give an
ephemeral port to any outgoing connection or bind(0), and then the daemon cannot come back."""

from __future__ import annotations

import pytest

from eos.errors import EnvironmentProblem
from eos_ops import jvm, localkafka, localpg
from eos_ops.hdfs import HdfsPorts


def span_from(first: int, count: int) -> list[int]:
    """The ports a LocalCluster uses from one draw. (Drawn once: a comprehension that called
    free_port per port compared six independent draws, and two of them overlapped now and then.)"""
    return [first + i for i in range(count)]


def outside_ephemeral_range(ports: list[int]) -> bool:
    low, high = jvm.ephemeral_range()
    return all(not low <= port <= high for port in ports)


@pytest.mark.parametrize(
    "choose",
    [
        pytest.param(lambda: jvm.free_ports(6), id="jvm.free_ports"),
        pytest.param(lambda: list(vars(HdfsPorts.choose()).values()), id="HdfsPorts.choose"),
        pytest.param(lambda: span_from(localkafka.free_port(span=6), 6), id="localkafka.free_port"),
        pytest.param(lambda: [localpg.free_port()], id="localpg.free_port"),
    ],
)
def test_daemon_ports_are_free_and_outside_the_ephemeral_range(choose) -> None:
    for _ in range(20):  # random choices: more than one draw
        ports = choose()
        assert len(set(ports)) == len(ports), ports
        assert outside_ephemeral_range(ports), (jvm.ephemeral_range(), ports)
        assert all(jvm.port_is_free("127.0.0.1", port) for port in ports), ports


def test_no_port_left_is_a_clear_error() -> None:
    pool = jvm.daemon_port_pool()
    with pytest.raises(EnvironmentProblem, match=f"could not find 2 free TCP ports on 127.0.0.1 in {pool.start}-"):
        jvm.free_ports(2, avoid=pool)
