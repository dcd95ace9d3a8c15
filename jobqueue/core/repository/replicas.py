"""replica_lag: how far behind its primary the server of a connection is, for pages that read
from a replica (JOBQUEUE_READ_URL) and for the replicas watched by jobqueue.core.replica_watch
(JOBQUEUE_REPLICA_URLS: the health panel, the doctor, the pacing of bulk actions).

The figure is the server's own Seconds_Behind_Master (Seconds_Behind_Source on MySQL 8.0.22+):
the age of the event its SQL thread is applying, 0 once it has applied all it received. The
server reports NULL whenever a replication thread is not running (stopped, or the IO thread
reconnecting to a dead primary), so NULL is shown as "replication not running": its data may be
any age. A server that replicates from nobody is the primary itself (after a failover the replica
a read URL names may have been promoted): its reads are current. Reading the status needs the
REPLICATION CLIENT privilege (MySQL) or SLAVE MONITOR (MariaDB); without it the lag is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..db import error_code, is_mysql

ER_SPECIFIC_ACCESS_DENIED = 1227
ER_PARSE_ERROR = 1064  # SHOW REPLICA STATUS on a server older than MySQL 8.0.22 / MariaDB 10.5.1


@dataclass(frozen=True)
class ReplicaLag:
    replica: bool | None  # None: could not tell (no privilege)
    seconds: int | None  # Seconds_Behind_Master; None when not replicating or unknown
    detail: str  # for the page: "2 s behind", "replication not running", ...
    io_running: str | None = None  # Slave_IO_Running: "Yes", "No", "Connecting"; None: not a replica
    sql_running: str | None = None  # Slave_SQL_Running: "Yes", "No"

    @property
    def current(self) -> bool:
        """Reads here are as fresh as the primary's (caught up, or the primary itself)."""
        return self.replica is False or self.seconds == 0


@dataclass(frozen=True)
class ReplicaReport:
    """One watched replica as last read: its lag, or why it could not be read."""

    address: str  # host:port, never the URL (it may hold a password)
    lag: ReplicaLag | None  # None: the server did not answer
    error: str | None = None  # why it did not

    @property
    def seconds(self) -> int | None:
        """Seconds_Behind_Master when known (replicating, both threads running)."""
        return self.lag.seconds if self.lag is not None and self.lag.replica else None

    @property
    def detail(self) -> str:
        if self.lag is None:
            return f"did not answer: {self.error}"
        return self.lag.detail

    def over(self, limit: float) -> bool:
        return self.seconds is not None and self.seconds > limit

    @property
    def unread(self) -> bool:
        """Its lag cannot be known now (down, replication stopped, no privilege)."""
        return self.lag is None or (self.lag.replica is not False and self.lag.seconds is None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "reachable": self.lag is not None,
            "replica": self.lag.replica if self.lag is not None else None,
            "seconds_behind": self.seconds,
            "io_running": self.lag.io_running if self.lag is not None else None,
            "sql_running": self.lag.sql_running if self.lag is not None else None,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Pause:
    """What a bulk action's wait before its next batch came to."""

    waited: float  # seconds this wait took
    limit: int
    lagging: tuple[ReplicaReport, ...]  # still over the limit: do not write the next batch yet
    unread: tuple[ReplicaReport, ...]  # could not be read: not waited for
    waited_for: tuple[ReplicaReport, ...] = ()  # over the limit when the wait began

    @property
    def holding(self) -> bool:
        return bool(self.lagging)

    @property
    def note(self) -> str | None:
        """For the bulk's progress: who it waits (or waited) for, and whom it could not read."""
        if self.lagging:
            parts = [
                f"replica {r.address} is {r.seconds} s behind, over the {self.limit} s bound" for r in self.lagging
            ]
        else:
            parts = [f"replica {r.address} was {r.seconds} s behind" for r in self.waited_for]
        parts += [f"replica {r.address} could not be read ({r.detail}), so nothing waits for it" for r in self.unread]
        return "; ".join(parts) or None


def replica_lag(conn: Connection) -> ReplicaLag:
    if not is_mysql(conn):
        return ReplicaLag(False, None, "not a replica")
    rows = None
    for statement in ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
        try:
            result = conn.exec_driver_sql(statement)
            rows = [dict(r._mapping) for r in result]
            break
        except DBAPIError as exc:
            if error_code(exc) == ER_PARSE_ERROR:
                continue
            if error_code(exc) == ER_SPECIFIC_ACCESS_DENIED:
                return ReplicaLag(None, None, "lag unknown (the read account lacks REPLICATION CLIENT / SLAVE MONITOR)")
            raise
        finally:
            if conn.in_transaction():
                conn.rollback()
    if not rows:
        return ReplicaLag(False, None, "not a replica: reads are current")
    status = rows[0]
    seconds = status.get("Seconds_Behind_Source", status.get("Seconds_Behind_Master"))
    io = status.get("Replica_IO_Running", status.get("Slave_IO_Running"))
    sql = status.get("Replica_SQL_Running", status.get("Slave_SQL_Running"))
    if seconds is None:
        return ReplicaLag(True, None, f"replication not running (IO {io}, SQL {sql}): data may be stale", io, sql)
    return ReplicaLag(True, int(seconds), f"{int(seconds)} s behind the primary", io, sql)
