"""Fault-injection soak for the queue: `python -m soak.run` (see docs/soak-and-drill.md)."""
