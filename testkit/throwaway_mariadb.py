"""The old name of testkit.throwaway (a throwaway server, now in three flavours)."""

from testkit.throwaway import ThrowawayMariaDB, ThrowawayServer, free_port

__all__ = ["ThrowawayMariaDB", "ThrowawayServer", "free_port"]
