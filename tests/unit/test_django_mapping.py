"""How an attempt's history reads as Django's TaskError and worker_ids (jobqueue.django.backend),
and the error head the worker writes for it (slots.describe): no server needed."""

from __future__ import annotations

from datetime import datetime

from jobqueue.core.errors import PermanentError
from jobqueue.core.models import Job, Status
from jobqueue.core.worker.slots import describe
from jobqueue.django.backend import task_error, worker_ids


def raised(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException as caught:
        return describe(caught)


def attempt(n: int, outcome: str, error: str | None, worker: str = "h:1:1") -> dict:
    return {"attempt": n, "outcome": outcome, "error": error, "worker": worker, "started_at": datetime(2026, 1, 1)}


def test_an_attempt_that_raised_names_its_class_path_and_keeps_the_traceback():
    builtin = raised(ValueError("bad\nrow: 7"))
    assert builtin.startswith("ValueError: bad\nrow: 7\nTraceback")  # builtins read as before
    error = task_error(attempt(1, "retry", builtin))
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):") and "ValueError: bad" in error.traceback
    ours = task_error(attempt(2, "fail", raised(PermanentError("no"))))
    assert ours.exception_class_path == "jobqueue.core.errors.PermanentError" and ours.exception_class is PermanentError


def test_attempts_that_raised_nothing_map_to_their_own_classes_or_to_no_error():
    assert task_error(attempt(1, "timeout", "timed out after 2 s")).exception_class is TimeoutError
    lost = task_error(attempt(1, "lease_expired", "lease expired"))
    assert lost.exception_class_path == "jobqueue.core.errors.LeaseLostError"
    assert (
        task_error(attempt(1, "fail", "bad data")).exception_class_path == "builtins.Exception"
    )  # a hand-written reason
    for outcome in ("release", "requeued", "failed_by_operator", "cancelled", "done"):
        assert task_error(attempt(1, outcome, "x")) is None


def test_worker_ids_have_one_owner_per_attempt():
    job = Job(
        id=1,
        task_key="k",
        task_name="t.f",
        queue="default",
        priority=0,
        payload={},
        status=Status.DONE,
        attempts=3,
        max_attempts=5,
        lease_owner="h:2:1",
    )
    history = [attempt(1, "retry", "x", "h:1:1"), attempt(2, "lease_expired", "y", "h:1:2")]
    assert worker_ids(job, history) == ["h:1:1", "h:1:2", "h:2:1"]
    assert (
        worker_ids(
            Job(
                id=2,
                task_key="k2",
                task_name="t.f",
                queue="default",
                priority=0,
                payload={},
                status=Status.READY,
                attempts=0,
                max_attempts=5,
            ),
            [],
        )
        == []
    )
