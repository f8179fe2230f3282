"""eos commands provided by the operational tools (registered as entry points)."""
