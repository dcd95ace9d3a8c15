"""How an application uses the public API, checked by `mypy --strict` (tests/unit/test_typing.py):
if a signature loses its types, this file stops type-checking."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from flask import Flask, Request, session
from sqlalchemy.orm import Session

from jobqueue import Enqueued, Explanation, Job, JobContext, JobQueue, Status, set_default, task
from jobqueue.web import init_dashboard


@task("send_invoice", queue="billing", max_attempts=10)
def send_invoice(payload: dict[str, Any], ctx: JobContext) -> None:
    with ctx.transaction() as conn:
        conn.execute(sa.text("UPDATE invoices SET sent = 1 WHERE id = :id"), {"id": payload["invoice"]})
    ctx.record_result({"invoice": payload["invoice"]})


def application(engine: sa.Engine) -> list[int]:
    jq = JobQueue(engine)
    set_default(jq)
    first: Enqueued = jq.enqueue(send_invoice, "invoice-42", {"invoice": 42})
    again: Enqueued = send_invoice.enqueue("invoice-42", {"invoice": 42}, priority=1)
    with engine.begin() as conn:
        jq.enqueue("send_invoice", "invoice-43", {"invoice": 43}, conn=conn)
    with Session(engine) as session:
        jq.enqueue_many([{"task": "send_invoice", "task_key": "invoice-44"}], conn=session)
        session.commit()
    job: Job | None = jq.get(first.id)
    ready: list[Job] = jq.list(status=Status.READY, queue="billing", limit=10)
    if job is not None and job.status is Status.FAILED:
        jq.requeue(job.id, again=True)
    elif job is not None and job.status is Status.READY:
        cancelled: Status | None = jq.cancel(job.id, "not needed", actor="app:billing").after
        assert cancelled is Status.CANCELLED
    why: Explanation = jq.explain(first.id)
    _codes: list[str] = [reason.code for reason in why.reasons] + why.codes
    jq.close()
    return [first.id, again.id] + [j.id for j in ready]


def shop(app: Flask) -> None:
    """The dashboard mounted in the application's own Flask app, behind its own login."""

    def role(req: Request) -> str | None:
        return "admin" if session.get("staff") == "ada" else None

    init_dashboard(app, "/jobs-admin", authorize=role, user_name=lambda req: str(session["staff"]))
