"""Transactions that survive deadlocks and lost connections, and the caller's own transaction."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .. import retry
from ..errors import NotPrimary, TransactionConflict, TransientDatabaseError
from ..logs import event as log_event
from .codes import ER_CHECKREAD, NOT_PRIMARY_ERRORS, TRANSACTION_ROLLED_BACK, error_code, transient_kind
from .primary import mark_not_primary

log = logging.getLogger("jobqueue.db")
T = TypeVar("T")

# A deadlock is resolved at once and worth retrying; each lock-wait timeout already cost a full
# innodb_lock_wait_timeout, so give up on the second.
TRANSACTION = retry.RetryPolicy(attempts=6, first_delay=0.01, max_delay=0.5, attempts_by_kind={"lock_timeout": 2})
# A web request (an engine built with a statement time limit) does not wait twice: its user gets
# 503 with Retry-After after one lock wait, and the thread is free for the next request.
REQUEST_TRANSACTION = retry.RetryPolicy(
    attempts=6, first_delay=0.01, max_delay=0.5, attempts_by_kind={"lock_timeout": 1}
)


@contextlib.contextmanager
def callers_transaction(what: str) -> Iterator[None]:
    """Inside a transaction the caller owns: an error after which the server rolled the whole
    transaction back is raised as TransactionConflict, which says so; the caller retries it."""
    try:
        yield
    except DBAPIError as exc:
        code = error_code(exc)
        if code not in TRANSACTION_ROLLED_BACK:
            raise
        why = (
            "a row changed after the transaction's snapshot (REPEATABLE READ with innodb_snapshot_isolation)"
            if code == ER_CHECKREAD
            else "a deadlock"
        )
        raise TransactionConflict(
            f"{what}: the server rolled back your transaction ({why}: {exc.orig}); "
            "none of its writes were kept: run the whole transaction again"
        ) from exc


def transaction(
    conn: Connection, fn: Callable[[Connection], T], *, what: str, policy: retry.RetryPolicy | None = None
) -> T:
    """Run `fn(conn)` in its own short transaction; retry deadlocks, lock-wait timeouts and lost
    connections with jittered exponential backoff.

    InnoDB resolves a deadlock by rolling back one transaction, and a connection can drop between
    two statements; both are normal for a queue under load. They are counted and retried, and
    only when they persist does the caller see TransientDatabaseError. A server that refuses
    writes as read-only raises NotPrimary (not retried here: a failover takes seconds).
    """
    if policy is None:
        policy = getattr(conn.engine, "transaction_policy", TRANSACTION)
    if conn.in_transaction():
        # The caller owns the transaction (say, an enqueue next to its own business rows); it
        # also owns commit and retry.
        with callers_transaction(what):
            return fn(conn)

    def once() -> T:
        try:
            with conn.begin():
                return fn(conn)
        except DBAPIError as exc:
            if error_code(exc) in NOT_PRIMARY_ERRORS:
                mark_not_primary(conn, f"refused a write as read-only: {exc.orig}")
                raise NotPrimary(f"{what}: the server refused the write as read-only ({exc.orig})") from exc
            raise
        except NotPrimary as exc:
            # The transaction read the flags itself (a claim, a fenced write): the connection's
            # role must say so too, or the next uses would go on trying this server.
            mark_not_primary(conn, str(exc))
            raise

    def on_retry(kind: str, attempt: int, delay: float, exc: BaseException) -> None:
        from .. import metrics

        metrics.TRANSIENT_RETRIES.labels(kind=kind, operation=what).inc()
        log_event(
            log,
            logging.WARNING,
            "db_retry",
            operation=what,
            kind=kind,
            attempt=attempt,
            delay_ms=f"{delay * 1000:.0f}",
            error=str(getattr(exc, "orig", exc))[:200],
        )

    try:
        return retry.call(once, policy, transient_kind, on_retry=on_retry)
    except retry.RetriesExhausted as exc:
        from .. import metrics

        metrics.TRANSIENT_RETRIES.labels(kind=exc.kind, operation=what).inc()
        raise TransientDatabaseError(
            f"{what}: {exc.kind} persisted after {exc.attempts} attempts: {getattr(exc.last, 'orig', exc.last)}"
        ) from exc.last
