"""A Hypothesis stateful test of the lease lifecycle: the real repository and the real lease keeper
on a real (SQLite) database whose clock the test moves, with two worker processes' keepers.

Rules: claim, start, renew (the statement running later than it was sent), a renewal that fails,
the keeper giving up on overdue leases, complete, retry, release on shutdown, an operator's forced
requeue and fail, the reaper, promotion, and COMMITs whose reply is lost. Invariants after every
step:

- a job is never started by a new attempt while an older attempt's lease is still valid by its
  local deadline (unless an operator took the job on purpose: a forced requeue or a fail);
- attempts never go backwards;
- a fenced write of a lease that is no longer the row's changes nothing.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time

import hypothesis.strategies as st
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from jobqueue.core import db, service
from jobqueue.core.db import create_engine
from jobqueue.core.errors import InvalidState, LeaseLostError
from jobqueue.core.migrate import init_db
from jobqueue.core.models import Outcome, Status
from jobqueue.core.schema import job_queue
from jobqueue.core.tasks import JobContext
from jobqueue.core.worker.leases import LeaseKeeper, LeaseState

LEASE = 10.0
JOBS = 3
WORKERS = ("w1", "w2")
jq = job_queue.c


class Clock:
    """Model time: the database's clock and every keeper's monotonic clock are this."""

    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("leases") / "template.sqlite3"
    engine = create_engine(f"sqlite:///{path}", pool_size=1)
    init_db(engine)
    engine.dispose()
    return path


class LeaseLifecycle(RuleBasedStateMachine):
    template = None
    workdir = None

    def __init__(self):
        super().__init__()
        self.clock = Clock()
        LeaseLifecycle.counter = getattr(LeaseLifecycle, "counter", 0) + 1
        path = self.workdir / f"case-{LeaseLifecycle.counter}.sqlite3"
        shutil.copy(self.template, path)
        self.path = path
        self.engine = create_engine(f"sqlite:///{path}", pool_size=1)
        self._real_clock = db.clock.sqlite_clock
        db.clock.sqlite_clock = self.clock
        self.conn = self.engine.connect()
        self.keepers = {w: LeaseKeeper(LEASE, clock=self.clock) for w in WORKERS}
        self.revoked: set[tuple[int, int]] = set()  # (job, attempt) an operator took on purpose
        self.max_attempts_seen: dict[int, int] = {}
        self.lose_next_reply = False
        self._install_lost_replies()

    def _install_lost_replies(self):
        dialect = self.engine.dialect
        real = dialect.do_commit
        machine = self

        def do_commit(dbapi_connection):
            real(dbapi_connection)
            if machine.lose_next_reply:
                machine.lose_next_reply = False
                raise sqlite3.OperationalError("database is locked (the COMMIT's reply was lost)")

        dialect.do_commit = do_commit

    def teardown(self):
        db.clock.sqlite_clock = self._real_clock
        self.conn.close()
        self.engine.dispose()

    # --- helpers ---------------------------------------------------------------------------------

    def held(self, worker: str):
        return self.keepers[worker].held()

    def row(self, job_id: int):
        found = dict(self.conn.execute(sa.select(job_queue).where(jq.id == job_id)).one()._mapping)
        self.conn.commit()  # end the read: each verb runs in a transaction of its own
        return found

    def fenced_write(self, held, write, lose_reply=False):
        """A worker's fenced write (its COMMIT's reply lost, if asked); if its lease is no longer
        the row's, the row must not change."""
        before = dict(self.row(held.lease.job_id))
        current = (before["status"], before["lease_owner"], before["attempts"])
        mine = current == (Status.RUNNING.value, held.lease.owner, held.lease.attempt)
        self.lose_next_reply = lose_reply
        try:
            result = write()
        finally:
            self.lose_next_reply = False
        after = dict(self.row(held.lease.job_id))
        if not mine:
            assert after == before, f"a stale lease {held.lease} changed the row: {before} -> {after}"
        return result, mine

    # --- rules -----------------------------------------------------------------------------------

    @initialize()
    def enqueue(self):
        service.enqueue_many(
            self.conn, [{"task": "noop", "task_key": f"j{i}", "max_attempts": 50} for i in range(JOBS)]
        )

    @rule(
        worker=st.sampled_from(WORKERS),
        slot=st.integers(1, 2),
        execution_delay=st.floats(0, 1.5),
        reply_delay=st.floats(0, 3.0),
    )
    def claim(self, worker, slot, execution_delay, reply_delay):
        keeper = self.keepers[worker]
        if any(h.slot == slot for h in keeper.held()):
            return
        sent = self.clock()
        self.clock.now += execution_delay  # the claim runs later than it was sent...
        got = service.claim(self.conn, f"{worker}:{slot}", 1, ["default"], lease_seconds=LEASE)
        self.clock.now += reply_delay  # ...and its answer arrives later still
        for c in got:
            ctx = JobContext(
                job_id=c.job.id,
                task_key=c.job.task_key,
                task_name="noop",
                queue="default",
                attempt=c.lease.attempt,
                max_attempts=c.job.max_attempts,
                worker_id=c.lease.owner,
                _record_result=lambda r: True,
                lease_lost=threading.Event(),
            )
            held = keeper.hold(c, slot, ctx, sent_at=sent)
            self.check_new_attempt(c.job.id, c.lease.attempt)
            assert keeper.start(held)

    def check_new_attempt(self, job_id, attempt):
        # The invariant at the moment it matters: a new attempt starts; every older attempt of
        # this job still valid by its local deadline must have been taken by an operator.
        for keeper in self.keepers.values():
            for h in keeper.held():
                if h.lease.job_id == job_id and h.lease.attempt < attempt and not h.lost and self.clock() < h.deadline:
                    assert (job_id, h.lease.attempt) in self.revoked, (
                        f"attempt {attempt} of job {job_id} started while attempt {h.lease.attempt} was still "
                        f"valid until {h.deadline - self.clock():.2f}s from now"
                    )

    # Steps around the lease's length find the edges (a deadline a moment before or after the
    # database's expiry); small ones interleave renewals and writes.
    @rule(
        seconds=st.one_of(st.floats(0.05, 12.0), st.sampled_from([LEASE - 1.0, LEASE - 0.25, LEASE + 0.1, LEASE + 2.5]))
    )
    def time_passes(self, seconds):
        self.clock.now += seconds

    @rule(
        worker=st.sampled_from(WORKERS),
        execution_delay=st.floats(0, 1.5),
        reply_delay=st.floats(0, 3.0),
        lose_reply=st.booleans(),
    )
    def renew(self, worker, execution_delay, reply_delay, lose_reply):
        keeper = self.keepers[worker]
        items, sent = keeper.begin_renewal()
        if not items:
            return
        self.clock.now += execution_delay  # the statement runs later than it was sent
        self.lose_next_reply = lose_reply
        outcomes = service.renew(self.conn, [h.lease for h in items], LEASE)
        self.lose_next_reply = False
        self.clock.now += reply_delay
        keeper.end_renewal(items, sent, outcomes)

    @rule(worker=st.sampled_from(WORKERS))
    def renewal_fails(self, worker):
        keeper = self.keepers[worker]
        items, sent = keeper.begin_renewal()
        keeper.end_renewal(items, sent, None)

    @rule(worker=st.sampled_from(WORKERS))
    def give_up_overdue(self, worker):
        for gone in self.keepers[worker].overdue():
            assert gone.held.ctx.lease_lost.is_set()

    @rule(worker=st.sampled_from(WORKERS), pick=st.integers(0, 3), lose_reply=st.booleans())
    def complete(self, worker, pick, lose_reply):
        keeper = self.keepers[worker]
        items = keeper.held(LeaseState.RUNNING, LeaseState.LOST)
        if not items:
            return
        held = items[pick % len(items)]
        keeper.finishing(held)
        with keeper.writing([held]):
            outcome, mine = self.fenced_write(held, lambda: service.complete(self.conn, held.lease), lose_reply)
        if mine:
            assert outcome is Outcome.OK, "the holder of the row's lease completes it (even if the reply was lost)"
            assert self.row(held.lease.job_id)["status"] == Status.DONE.value
        keeper.drop(held)

    @rule(
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 3),
        lose_reply=st.booleans(),
        verb=st.sampled_from(["retry", "release"]),
    )
    def retry_or_release(self, worker, pick, lose_reply, verb):
        keeper = self.keepers[worker]
        items = keeper.held()
        if not items:
            return
        held = items[pick % len(items)]
        keeper.finishing(held)
        write = (
            (lambda: service.retry(self.conn, held.lease, "boom", 0))
            if verb == "retry"
            else (lambda: service.release(self.conn, held.lease))
        )
        with keeper.writing([held]):
            outcome, mine = self.fenced_write(held, write, lose_reply)
        if mine:
            assert outcome is Outcome.OK
        keeper.drop(held)

    @rule(job=st.integers(1, JOBS), verb=st.sampled_from(["requeue", "fail"]))
    def operator(self, job, verb):
        before = self.row(job)
        try:
            if verb == "requeue":
                service.requeue_job(self.conn, job, force=True, actor="test")
            else:
                service.fail_job(self.conn, job, "operator", actor="test")
        except InvalidState:
            return
        if before["status"] == Status.RUNNING.value:
            self.revoked.add((job, before["attempts"]))
        if verb == "fail":  # give the job back to the game
            service.requeue_job(self.conn, job, actor="test")

    @rule()
    def reap(self):
        service.reap(self.conn)

    @rule(worker=st.sampled_from(WORKERS), slot=st.integers(1, 2))
    def reap_then_claim(self, worker, slot):
        """A reaper and a hungry worker right behind it: the moment a second attempt can start."""
        if service.reap(self.conn).reclaimed:
            self.claim(worker, slot, 0.0, 0.0)

    @rule()
    def promote(self):
        service.promote_due(self.conn)

    @rule(worker=st.sampled_from(WORKERS), pick=st.integers(0, 3))
    def record_result_needs_the_lease(self, worker, pick):
        items = self.held(worker)
        if not items:
            return
        held = items[pick % len(items)]
        row = self.row(held.lease.job_id)
        mine = (row["status"], row["lease_owner"], row["attempts"]) == (
            Status.RUNNING.value,
            held.lease.owner,
            held.lease.attempt,
        )
        try:
            service.record_result(self.conn, held.lease, row["task_key"], {"by": held.lease.owner})
        except LeaseLostError:
            assert not mine, "the lease holder may record its result"
        else:
            assert mine, "a stale lease recorded a result"

    # --- invariants ------------------------------------------------------------------------------

    @invariant()
    def attempts_never_go_backwards(self):
        for job_id, attempts in self.conn.execute(sa.select(jq.id, jq.attempts)).all():
            assert attempts >= self.max_attempts_seen.get(job_id, 0)
            self.max_attempts_seen[job_id] = attempts
        self.conn.commit()

    @invariant()
    def at_most_one_valid_unrevoked_lease_per_job(self):
        now = self.clock()
        valid: dict[int, list[int]] = {}
        for keeper in self.keepers.values():
            for h in keeper.held():
                if not h.lost and now < h.deadline and (h.lease.job_id, h.lease.attempt) not in self.revoked:
                    valid.setdefault(h.lease.job_id, []).append(h.lease.attempt)
        for job_id, attempts in valid.items():
            assert len(attempts) <= 1, f"job {job_id}: attempts {attempts} all believe they hold it"


def test_the_lease_lifecycle(template_db, tmp_path):
    LeaseLifecycle.template = template_db
    LeaseLifecycle.workdir = tmp_path
    case = LeaseLifecycle.TestCase
    case.settings = settings(
        max_examples=200,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    case("runTest").runTest()


@pytest.mark.parametrize("claim_reply, renew_reply", [(3.0, 0.0), (0.0, 3.0)])
def test_a_slow_answer_never_stretches_the_local_deadline(template_db, tmp_path, claim_reply, renew_reply):
    """The edge the random walk above finds only now and then, played on purpose: the claim's (or
    a renewal's) answer arrives 3 s after it ran. The local deadline must count from when the
    statement was sent, or the worker would believe in its lease for 3 s after the database
    let another worker take the job."""
    LeaseLifecycle.template = template_db
    LeaseLifecycle.workdir = tmp_path
    state = LeaseLifecycle()
    try:
        state.enqueue()
        state.claim("w1", 1, 0.0, claim_reply)
        if renew_reply:
            state.renew("w1", 0.0, renew_reply, False)
        state.time_passes(LEASE - 3.0 + 0.5)  # the database's lease has run out; ours must have too
        state.reap_then_claim("w2", 1)
        assert state.keepers["w2"].held(), "the second worker took the reaped job"
        state.at_most_one_valid_unrevoked_lease_per_job()
    finally:
        state.teardown()
