"""Did anything run on a server while it was read-only? Read from the servers themselves: their
general logs (what they were sent) and their binary logs (what they wrote).

A server's read-only periods in the drill:
- the replica (db2) from its start until its promotion: the general log entries before the
  `SET GLOBAL read_only = OFF` that promote() sends;
- the old primary (db1) after the failover: everything it logged after its restart (the general
  log from the size it had when the server died), since demote() starts it with --read-only.

The binary logs say the same from the other side, by server id: every transaction carries the id
of the server that wrote it first. The replica must have no transaction of its own before its
first one as the primary (in one GTID domain its own transactions would sit among the primary's),
and the old primary must hold no more of its own transactions than the new one received from it
(an extra one was written after its demotion, or never replicated).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from testkit.replication import binlog_events, read_general_log
from testkit.throwaway import ThrowawayServer

CLAIM = re.compile(r"FROM job_queue .*FOR UPDATE SKIP LOCKED", re.IGNORECASE | re.DOTALL)
CLAIM_UPDATE = re.compile(r"^\s*UPDATE job_queue SET status\s*=\s*'running'", re.IGNORECASE)
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
PROMOTION = re.compile(r"^\s*SET GLOBAL read_only\s*=\s*OFF", re.IGNORECASE)


@dataclass
class ReadOnlyWindow:
    server: str  # "db2 before its promotion", ...
    statements: int = 0  # by the application's account
    claims: int = 0  # the claim's locking SELECT, refused there (error 1290)
    claim_updates: int = 0  # the claim's UPDATE: would mean a claim took rows there
    writes: int = 0  # any INSERT/UPDATE/DELETE by the application
    examples: list[str] = field(default_factory=list)


def window_of(entries, server: str, app_user: str) -> ReadOnlyWindow:
    window = ReadOnlyWindow(server)
    for e in entries:
        if e.command not in ("Query", "Execute") or not (e.user or "").startswith(app_user + "@"):
            continue
        window.statements += 1
        if CLAIM.search(e.argument):
            window.claims += 1
        if CLAIM_UPDATE.search(e.argument):
            window.claim_updates += 1
        if WRITE.search(e.argument):
            window.writes += 1
            if len(window.examples) < 3:
                window.examples.append(e.argument[:200])
    return window


def replica_before_promotion(replica: ThrowawayServer, app_user: str) -> ReadOnlyWindow:
    entries = read_general_log(replica)
    cut = next(
        (
            i
            for i, e in enumerate(entries)
            if e.command == "Query" and PROMOTION.search(e.argument) and (e.user or "").startswith("root@")
        ),
        len(entries),
    )
    return window_of(entries[:cut], "db2 (the replica) before its promotion", app_user)


def old_primary_after_demotion(old: ThrowawayServer, app_user: str, offset: int, scratch: Path) -> ReadOnlyWindow:
    """What the old primary logged after `offset`, the size of its general log once it was dead
    (a header line does not mark the restart: turning the general log on at run time writes one
    too)."""
    with open(old.general_log_file, "rb") as f:
        f.seek(offset)
        scratch.write_bytes(f.read())
    return window_of(
        read_general_log(scratch), "db1 (the old primary) after its restart as a read-only replica", app_user
    )


@dataclass
class BinlogVerdict:
    own_before_promotion: int  # db2's own transactions before its last transaction replicated from db1
    extra_on_old_primary: int  # db1's own transactions that db2 never received
    gtids: dict[str, dict[int, int]]  # server -> {server id: transactions}

    @property
    def clean(self) -> bool:
        return self.own_before_promotion == 0 and self.extra_on_old_primary == 0


def _gtid_server_ids(server: ThrowawayServer) -> list[int]:
    """The originating server id of each transaction in the server's binlogs, in order (the
    cluster's heartbeat writes included: they are transactions like any other)."""
    return [e.server_id for e in binlog_events(server) if e.event_type == "Gtid"]


def binlog_verdict(
    old_primary: ThrowawayServer, new_primary: ThrowawayServer, old_id: int = 1, new_id: int = 2
) -> BinlogVerdict:
    return compare_origins(_gtid_server_ids(old_primary), _gtid_server_ids(new_primary), old_id, new_id)


def compare_origins(old_ids: list[int], new_ids: list[int], old_id: int = 1, new_id: int = 2) -> BinlogVerdict:
    """From the originating server ids of the transactions in each server's binlog, in order."""
    last_replicated = max((i for i, sid in enumerate(new_ids) if sid == old_id), default=-1)
    own_before = sum(1 for sid in new_ids[:last_replicated] if sid == new_id)
    extra = Counter(old_ids)[old_id] - Counter(new_ids)[old_id]
    return BinlogVerdict(own_before, max(0, extra), {"db1": dict(Counter(old_ids)), "db2": dict(Counter(new_ids))})
