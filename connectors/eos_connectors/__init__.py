"""Connectors: the re-settable Kafka source and the two-phase-commit Kafka sink."""
