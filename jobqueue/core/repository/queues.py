"""Queues: pause and resume (queue_state), and the list of every known queue.

A paused queue still takes enqueues and its running jobs finish normally. The pause locks the
queue's row exclusively, and every claim share-locks the rows of the queues it claims from
(claim._open_queues), so the pause waits for the claims in flight and, once it has answered, no
claim of the queue commits; no handler of the queue starts either (a job that waited in hand for
a thread is checked against its queue's row when it starts, worker/slots.py, and goes back to
`ready`). Workers also leave paused queues out of the queues they claim from (workers on every
queue read the ready queues without the paused ones, see claim.ready_queues; workers with a list
of queues read the paused set, claim.paused_queues, at most every second). A queue may be paused
before it has any job. Each change is audited.

A claim gives a queue without a row one, not paused, with an empty `changed_by`: such a row says
nothing was ever changed, and queue_states leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import require_primary, transaction
from ..schema import queue_state
from ..validation import check_queue
from .common import audit, audited_once, database_now, upsert

qs = queue_state.c


@dataclass(frozen=True)
class QueueState:
    queue: str
    paused: bool
    changed_at: datetime | None = None
    changed_by: str | None = None
    changed: bool = False  # for pause/resume: whether this call changed it


def set_paused(conn: Connection, queue: str, paused: bool, *, actor: str) -> QueueState:
    """Pause or resume `queue`. Pausing a paused queue (or resuming a running one) changes
    nothing and is not an error."""
    queue = check_queue(queue)

    def write(c: Connection) -> QueueState:
        require_primary(c)
        row = c.execute(sa.select(queue_state).where(qs.queue == queue).with_for_update()).first()
        if row is not None and bool(row.paused) == paused:
            return QueueState(queue, paused, row.changed_at, row.changed_by, False)
        now = database_now(c)
        values = {"queue": queue, "paused": paused, "changed_at": now, "changed_by": actor[:100]}
        upsert(
            c,
            queue_state,
            ["queue"],
            values,
            {k: (lambda new, k=k: getattr(new, k)) for k in ("paused", "changed_at", "changed_by")},
        )
        audit(
            c,
            actor,
            "pause" if paused else "resume",
            selection=f"queue {queue}",
            before="paused" if row is not None and row.paused else "active",
            after="paused" if paused else "active",
            count=0,
        )
        return QueueState(queue, paused, now, actor[:100], True)

    action = "pause" if paused else "resume"

    def answer(c: Connection, _audited) -> QueueState:
        row = c.execute(sa.select(qs.changed_at, qs.changed_by).where(qs.queue == queue)).one()
        return QueueState(queue, paused, row.changed_at, row.changed_by, True)

    return audited_once(conn, write, what=action, action=action, actor=actor, selection=f"queue {queue}", answer=answer)


def queue_states(conn: Connection) -> dict[str, QueueState]:
    """Every queue that was ever paused (or resumed), by name."""
    rows = transaction(
        conn, lambda c: c.execute(sa.select(queue_state).where(qs.changed_by != "")).all(), what="queue_states"
    )
    return {r.queue: QueueState(r.queue, bool(r.paused), r.changed_at, r.changed_by) for r in rows}


__all__ = ["QueueState", "check_queue", "queue_states", "set_paused"]
