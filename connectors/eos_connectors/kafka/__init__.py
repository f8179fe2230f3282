"""The Kafka connector: the re-settable source and the two-phase-commit sink."""
