"""The benchmark's sections, in the order they run. Each has `run(bench) -> dict` (JSON-able)."""
