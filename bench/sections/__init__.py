"""The benchmark's sections. Each has `run(bench) -> dict` (JSON-able); they run in this order."""

SECTIONS = (
    "throughput",
    "peers",
    "latency",
    "epochcost",
    "skew",
    "protocol",
    "scaling",
    "cluster",
    "postgres",
    "delta",
    "recovery",
    "failover",
    "memory",
    "failpoints",
    "producer",
    "transactions",
    "profile",
    "costmodel",
    "jvmreader",
)
