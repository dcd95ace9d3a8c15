"""The one retry loop. Each call site declares its policy (how often, how long, which errors)
instead of writing a loop of its own:

- `db.TRANSACTION`: a short transaction hit a deadlock, a lock-wait timeout or a lost connection;
- `worker` finishing writes: a job's last write waits out a database restart;
- `worker` start: wait for the database to answer before the first claim;
- `enqueue`: another transaction inserted one of our task_keys between our read and our insert.

Backoff is exponential with jitter, so that processes that failed together do not retry together.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int | None = None  # at most this many calls (None: no limit)
    seconds: float | None = None  # stop retrying once this much time has passed (None: no limit)
    first_delay: float = 0.01  # pause after the first failure
    max_delay: float = 2.0  # pauses double up to this
    jitter: tuple[float, float] = (0.5, 1.5)
    attempts_by_kind: Mapping[str, int] = field(default_factory=dict)  # tighter limits for some kinds

    def delay(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Pause before retry `retry_number` (1 for the first retry)."""
        raw = min(self.max_delay, self.first_delay * (2 ** min(retry_number - 1, 32)))
        return raw * (rng or random).uniform(*self.jitter)


class RetriesExhausted(Exception):
    """Raised from `call` (chained to the last error) when a policy ran out; `kind` and
    `attempts` say what kept failing and how often."""

    def __init__(self, kind: str, attempts: int, last: BaseException):
        super().__init__(f"{kind} persisted after {attempts} attempts: {last}")
        self.kind = kind
        self.attempts = attempts
        self.last = last


def call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    classify: Callable[[BaseException], str | None],
    *,
    on_retry: Callable[[str, int, float, BaseException], None] | None = None,
    give_up: Callable[[], bool] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`fn()`, retried while `classify(error)` names a kind worth retrying and the policy allows.

    An error `classify` answers None for is raised at once. When the policy runs out (or
    `give_up()` says so) RetriesExhausted is raised from the last error. `on_retry(kind, attempt,
    delay, error)` is told about each retry before its pause (to count and log it).
    """
    started = clock()
    attempt = 0
    per_kind: dict[str, int] = {}
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            kind = classify(exc)
            if kind is None:
                raise
            per_kind[kind] = per_kind.get(kind, 0) + 1
            limit = policy.attempts_by_kind.get(kind, policy.attempts)
            out_of_time = policy.seconds is not None and clock() - started >= policy.seconds
            if (
                (limit is not None and per_kind[kind] >= limit)
                or (policy.attempts is not None and attempt >= policy.attempts)
                or out_of_time
                or (give_up is not None and give_up())
            ):
                raise RetriesExhausted(kind, attempt, exc) from exc
            delay = policy.delay(attempt)
            if on_retry is not None:
                on_retry(kind, attempt, delay, exc)
            sleep(delay)
