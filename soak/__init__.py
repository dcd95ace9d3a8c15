"""Fault-injection soak for the queue: `python -m soak.run` (see README, "Soak")."""
