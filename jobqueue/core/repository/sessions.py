"""Sign-in state every web process and host shares: dashboard sessions and the login throttle.

Sessions. The signed cookie carries a random token; `web_session` holds a digest of it with the
user, a digest of that user's password hash at sign-in, when it started and when it was last
seen, and when and why it ended. Logout, "sign out everywhere" and the idle and absolute limits
end a row, and every request checks its row, so a copied cookie stops working at once in every
process on every host. A password change in JOBQUEUE_USERS changes the digest, which ends the
user's older sessions the first time they are used.

The throttle. One row per client address and one per (address, user name) count the sign-in
attempts that did not succeed. After `free` attempts each further one waits twice as long as
the one before (capped); an attempt made while its row is blocked is refused without looking at
the password and counts too, so hammering only lengthens the wait. The address row is counted
first: while it is blocked no (address, user) row is made, so a guesser spraying user names adds
rows at the pace the throttle allows, and every row expires. The owner signing in from another
address has rows of their own and is not held up by the guesser.

The counter is taken before the password is checked (`login_attempt`), in one transaction with
the row locked, so parallel guesses cannot slip through between a read and a write; a sign-in
that then succeeds gives its attempt back (`login_succeeded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import db_after, db_now, transaction
from ..schema import login_throttle, web_session
from .common import as_datetime, audit, database_now, upsert

ws = web_session.c
lt = login_throttle.c
PRUNE_BATCH = 1000


# --- sessions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionState:
    user_name: str
    credential: str
    created_at: datetime
    last_seen_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    now: datetime  # the database clock, when this was read

    @property
    def age_seconds(self) -> float:
        return (self.now - self.created_at).total_seconds()

    @property
    def idle_seconds(self) -> float:
        return (self.now - self.last_seen_at).total_seconds()


def start_session(conn: Connection, session_id: str, *, user_name: str, credential: str, address: str | None) -> None:
    transaction(
        conn,
        lambda c: c.execute(
            sa.insert(web_session).values(
                id=session_id,
                user_name=user_name[:100],
                credential=credential,
                address=(address or "")[:64] or None,
                created_at=db_now(),
                last_seen_at=db_now(),
            )
        ),
        what="start_session",
    )


def session_state(conn: Connection, session_id: str) -> SessionState | None:
    def read(c: Connection) -> SessionState | None:
        row = c.execute(
            sa.select(
                ws.user_name,
                ws.credential,
                ws.created_at,
                ws.last_seen_at,
                ws.ended_at,
                ws.end_reason,
                db_now().label("now"),
            ).where(ws.id == session_id)
        ).first()
        if row is None:
            return None
        return SessionState(
            row.user_name,
            row.credential,
            as_datetime(row.created_at),
            as_datetime(row.last_seen_at),
            as_datetime(row.ended_at),
            row.end_reason,
            as_datetime(row.now),
        )

    return transaction(conn, read, what="session_state")


def touch_session(conn: Connection, session_id: str) -> None:
    """The session was used now (its idle limit starts again)."""
    transaction(
        conn,
        lambda c: c.execute(
            sa.update(web_session).where(ws.id == session_id, ws.ended_at.is_(None)).values(last_seen_at=db_now())
        ),
        what="touch_session",
    )


def end_session(conn: Connection, session_id: str, reason: str) -> bool:
    """End one session (logout, idle, expired, credential_changed); True if it was still open."""
    return transaction(
        conn,
        lambda c: (
            c.execute(
                sa.update(web_session)
                .where(ws.id == session_id, ws.ended_at.is_(None))
                .values(ended_at=db_now(), end_reason=reason[:20])
            ).rowcount
            == 1
        ),
        what="end_session",
    )


def end_sessions(conn: Connection, *, actor: str, user_name: str | None = None) -> int:
    """ "Sign out everywhere": end every open session of `user_name` (None: of every user), and
    audit it. Returns how many were ended."""

    def act(c: Connection) -> int:
        where = [ws.ended_at.is_(None)] + ([ws.user_name == user_name] if user_name is not None else [])
        n = c.execute(
            sa.update(web_session).where(*where).values(ended_at=db_now(), end_reason="signed_out_all")
        ).rowcount
        audit(
            c,
            actor,
            "sign_out_all",
            selection=f"sessions of {user_name}" if user_name is not None else "sessions of every user",
            count=n,
        )
        return n

    return transaction(conn, act, what="end_sessions")


def list_sessions(
    conn: Connection, *, idle_seconds: float, max_seconds: float, user_name: str | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    """Open sessions within their limits, most recently seen first."""

    def read(c: Connection) -> list[dict[str, Any]]:
        where = [
            ws.ended_at.is_(None),
            ws.last_seen_at > db_after(-idle_seconds),
            ws.created_at > db_after(-max_seconds),
        ]
        if user_name is not None:
            where.append(ws.user_name == user_name)
        rows = c.execute(
            sa.select(ws.id, ws.user_name, ws.address, ws.created_at, ws.last_seen_at)
            .where(*where)
            .order_by(ws.last_seen_at.desc())
            .limit(limit)
        ).all()
        return [dict(r._mapping) for r in rows]

    return transaction(conn, read, what="list_sessions")


# --- the login throttle --------------------------------------------------------------------------


@dataclass(frozen=True)
class ThrottleRule:
    scope: str  # "address" or "address_user"
    free: int  # attempts that may fail in a row before delays start
    first_delay: float  # seconds after the free ones run out; doubled on each further attempt
    max_delay: float
    forget: float  # seconds after the last attempt (or the end of its wait) when the count starts over

    def delay(self, attempts: int) -> float:
        if attempts < self.free:
            return 0.0
        return min(self.max_delay, self.first_delay * 2 ** min(attempts - self.free, 40))


@dataclass(frozen=True)
class ThrottleKey:
    id: str  # a digest of the scope and the address (and user name)
    rule: ThrottleRule


@dataclass(frozen=True)
class LoginGate:
    allowed: bool  # may the password be checked?
    wait_seconds: float  # refused: how long until the next attempt may be checked
    limit: str | None  # refused: the scope whose rule held


def login_attempt(conn: Connection, keys: Sequence[ThrottleKey]) -> LoginGate:
    """Count one sign-in attempt against each key, in order, and say whether its password may be
    checked. Once a key refuses, later keys are counted only if their rows exist (none is made)."""

    def act(c: Connection) -> LoginGate:
        now = database_now(c)
        refusals: list[tuple[float, str]] = []
        for key in keys:
            counted = _count(c, key, now, create=not refusals)
            if counted is None:
                continue
            failures, blocked_until = counted
            refused = blocked_until is not None and blocked_until > now
            delay = key.rule.delay(failures)
            block = now + timedelta(seconds=delay) if delay else None
            if refused:
                block = max(block or blocked_until, blocked_until)
                refusals.append(((block - now).total_seconds(), key.rule.scope))
            c.execute(
                sa.update(login_throttle)
                .where(lt.id == key.id)
                .values(blocked_until=block, expires_at=max(block or now, now) + timedelta(seconds=key.rule.forget))
            )
        if refusals:
            wait, scope = max(refusals)
            return LoginGate(False, wait, scope)
        return LoginGate(True, 0.0, None)

    return transaction(conn, act, what="login_attempt")


def _count(c: Connection, key: ThrottleKey, now: datetime, *, create: bool) -> tuple[int, datetime | None] | None:
    # One more attempt; a row past its expiry (not pruned yet) starts over. The row stays locked
    # until the transaction ends, so concurrent attempts are counted one after another.
    expired = lt.expires_at < now
    more = {
        "failures": sa.case((expired, 1), else_=lt.failures + 1),
        "blocked_until": sa.case((expired, sa.null()), else_=lt.blocked_until),
    }
    if create:
        upsert(
            c,
            login_throttle,
            ["id"],
            {
                "id": key.id,
                "scope": key.rule.scope,
                "failures": 1,
                "blocked_until": None,
                "expires_at": now + timedelta(seconds=key.rule.forget),
            },
            {column: (lambda new, value=value: value) for column, value in more.items()},
        )
    elif c.execute(sa.update(login_throttle).where(lt.id == key.id).values(**more)).rowcount == 0:
        return None
    row = c.execute(sa.select(lt.failures, lt.blocked_until).where(lt.id == key.id)).one()
    return row.failures, as_datetime(row.blocked_until)


def login_succeeded(conn: Connection, keys: Sequence[ThrottleKey]) -> None:
    """The attempt counted by login_attempt was the right password: (address, user) starts over,
    and the address gets its attempt back."""

    def act(c: Connection) -> None:
        for key in keys:
            if key.rule.scope == "address":
                # blocked_until first: MySQL's SET sees the columns it already assigned, SQLite's not.
                c.execute(
                    sa.update(login_throttle)
                    .where(lt.id == key.id)
                    .ordered_values(
                        (
                            lt.blocked_until,
                            sa.case((lt.failures - 1 < key.rule.free, sa.null()), else_=lt.blocked_until),
                        ),
                        (lt.failures, sa.case((lt.failures > 0, lt.failures - 1), else_=0)),
                    )
                )
            else:
                c.execute(sa.delete(login_throttle).where(lt.id == key.id))

    transaction(conn, act, what="login_succeeded")


# --- housekeeping --------------------------------------------------------------------------------


def prune_sign_in(conn: Connection, *, idle_seconds: float, max_seconds: float, batch: int = PRUNE_BATCH) -> int:
    """Delete expired throttle rows and sessions that ended or ran out, up to `batch` of each
    (by primary key, so no range of the table is locked). Returns how many rows went."""

    def act(c: Connection) -> int:
        n = 0
        ids = c.execute(sa.select(lt.id).where(lt.expires_at < db_now()).limit(batch)).scalars().all()
        if ids:
            n += c.execute(sa.delete(login_throttle).where(lt.id.in_(ids), lt.expires_at < db_now())).rowcount
        gone = sa.or_(
            ws.ended_at.is_not(None), ws.last_seen_at < db_after(-idle_seconds), ws.created_at < db_after(-max_seconds)
        )
        ids = c.execute(sa.select(ws.id).where(gone).limit(batch)).scalars().all()
        if ids:
            n += c.execute(sa.delete(web_session).where(ws.id.in_(ids))).rowcount
        return n

    return transaction(conn, act, what="prune_sign_in")
