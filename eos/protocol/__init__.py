"""The epoch commit protocol."""
