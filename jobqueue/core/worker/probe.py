"""The idle worker's read: why a claim would find nothing, on a connection of its own."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Engine

from .. import repository
from ..db import keep_when_idle, on_chosen_primary
from ..errors import NotPrimary
from ..models import EmptyClaimReport


class IdleProbe:
    """repository.claim.classify_statement on a connection of its own in autocommit mode: one statement
    per idle turn, no COMMIT, no ROLLBACK. The SQL is compiled once with this worker's queues
    inlined, and reads the server's read-only flags too, so an idle worker notices a demoted
    primary at no extra cost. The connection is never returned to the pool (it would carry
    autocommit to the next user); it is dropped on any error and made anew next time."""

    def __init__(self, engine: Engine, queues: Sequence[str] | None):
        self.engine = engine
        self.queues = queues
        self._sql: str | None = None
        self._flavour: str | None = None
        self._conn = None

    def read(self) -> EmptyClaimReport:
        if self._conn is not None and not on_chosen_primary(self.engine, self._conn.info):
            self.close()  # the engine moved to another candidate: read where the claims go
        if self._conn is None:
            self._conn = self.engine.raw_connection()
            self._conn.dbapi_connection.autocommit(True)
            keep_when_idle(self.engine, self._conn.dbapi_connection)
        try:
            if self._sql is None:
                with self.engine.connect() as conn:
                    self._flavour = repository.claim.flavour(conn)
                self._sql = str(
                    repository.claim.classify_statement(self.queues, self._flavour).compile(
                        dialect=self.engine.dialect, compile_kwargs={"literal_binds": True}
                    )
                )
            cursor = self._conn.dbapi_connection.cursor()
            try:
                cursor.execute(self._sql)
                row = cursor.fetchone()
            finally:
                cursor.close()
        except Exception:
            self.close()
            raise
        flags = repository.claim.read_only_flags(row, self._flavour)
        if flags:
            self.close()
            raise NotPrimary(f"the server is read-only ({', '.join(flags)} is ON); claiming paused")
        return repository.claim.classify_row(row)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.invalidate()
