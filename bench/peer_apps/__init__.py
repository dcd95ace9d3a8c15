"""Minimal no-op task apps for the peer queues (bench/peers.py runs them)."""
