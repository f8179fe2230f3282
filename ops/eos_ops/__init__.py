"""Operational tools around eos: status, verify, soak, demo, local servers."""
