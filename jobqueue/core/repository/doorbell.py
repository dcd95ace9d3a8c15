"""The doorbell: how an enqueue in one process wakes an idle worker in another at once.

MySQL has no LISTEN/NOTIFY. An idle worker therefore parks one dedicated connection in
`SELECT SLEEP(n)` with a marker comment naming its queues (`wait_for_ring`). The server's process
list is then the registry of who is asleep, with nothing to publish or expire: a process that
enqueued a ready job reads the sleepers (`sleepers`, at most a couple of times a second, see
jobqueue/core/doorbell.py) and ends their SLEEP with `KILL QUERY` (`ring`). SLEEP interrupted that
way returns 1 (or the statement fails with ER_QUERY_INTERRUPTED, depending on the server), and the
worker claims at once instead of sleeping out its backoff.

Why this is safe: the connection a doorbell id names runs nothing but the marked SLEEP, so a KILL
QUERY that arrives late (the SLEEP just ended) only shortens the next one: one early claim, nothing
else. Connection ids are the server's own and never reused while it runs, and the ids come from
the process list of the server this process is connected to, so a ring never reaches another
server's connection. Without the privilege to see or kill another account's threads (PROCESS,
CONNECTION ADMIN / SUPER), a sleeper of another account is invisible or the KILL is refused: the
worker then finds the job on its next poll, as before (at most its idle cap, 2 s by default).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..db import error_code

MARKER = "jobqueue doorbell"
ER_QUERY_INTERRUPTED = 1317
ER_NO_SUCH_THREAD = 1094
_QUEUES = re.compile(r"queues=([A-Za-z0-9_.,\-*]*)")

# Our own statement's text must not match the pattern: it starts with "SELECT ID", not "SELECT SLEEP".
# Only this database's sleepers: another install on the same server has workers of its own.
_SLEEPERS = sa.text(
    "SELECT ID, INFO FROM information_schema.PROCESSLIST "
    f"WHERE INFO LIKE 'SELECT SLEEP(%) /* {MARKER} %' AND ID <> CONNECTION_ID() AND DB = DATABASE()"
)


@dataclass(frozen=True)
class Sleeper:
    connection_id: int
    queues: tuple[str, ...]  # ("*",): every queue

    def serves(self, queue: str) -> bool:
        return "*" in self.queues or queue in self.queues


def wait_for_ring(conn: Connection, seconds: float, queues: Sequence[str] | None) -> bool:
    """Sleep on the server for up to `seconds`; True when a ring (KILL QUERY) ended it early.
    `conn` is in autocommit: the SLEEP opens no transaction, so none is ended after it.
    `queues`: the queues the worker serves (None: every queue), for ringers to choose by."""
    label = ",".join(queues) if queues else "*"
    if not _QUEUES.fullmatch(f"queues={label}"):
        raise ValueError(f"queue names unfit for the doorbell marker: {label!r}")
    try:
        # The numbers and names are checked above; a bound parameter would hide them from the
        # process list, which is what ringers read.
        woken = conn.exec_driver_sql(f"SELECT SLEEP({float(seconds):.3f}) /* {MARKER} queues={label} */").scalar()
    except DBAPIError as exc:
        if error_code(exc) == ER_QUERY_INTERRUPTED:
            return True
        raise
    return bool(woken)


def sleepers(conn: Connection) -> list[Sleeper]:
    """The idle workers asleep on this server that this account can see."""
    rows = conn.execute(_SLEEPERS).all()
    conn.rollback()
    out = []
    for connection_id, info in rows:
        found = _QUEUES.search(info or "")
        if found:
            out.append(Sleeper(int(connection_id), tuple(q for q in found.group(1).split(",") if q)))
    return out


def ring(conn: Connection, connection_ids: Sequence[int]) -> int:
    """End those sleepers' SLEEP; returns how many were rung. A sleeper gone meanwhile is not an
    error; a refused KILL (another account's thread, no privilege) raises."""
    rung = 0
    for connection_id in connection_ids:
        try:
            conn.exec_driver_sql(f"KILL QUERY {int(connection_id)}")
            rung += 1
        except DBAPIError as exc:
            if error_code(exc) != ER_NO_SUCH_THREAD:
                raise
    conn.rollback()
    return rung


__all__ = ["MARKER", "Sleeper", "ring", "sleepers", "wait_for_ring"]
