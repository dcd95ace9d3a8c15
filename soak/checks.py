"""The end-of-run checks, as pure functions over what the soak saw and what the tables hold.

This is Jepsen's total-queue check adapted to a job queue: every task_key the queue acknowledged
(HTTP 201/200, or `jobqueue enqueue` exiting 0) must come out `done` or `failed` with a reason,
or `cancelled` when the soak cancelled it (a cancelled job counts as finished).
A missing or unfinished one is lost and fails the run. Executions of the same job by several
workers are counted and explained (a killed or stopped worker, a database outage), not failed:
at-least-once execution is the contract. Two results for one task_key, or the same attempt run
twice, would break the contract and fail the run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("done", "failed", "cancelled")
BATCH_COLUMNS = ("state", "total", "done", "failed", "cancelled", "success_job_id", "failure_job_id", "complete_job_id")
CALLBACK_PREFIX = "batch:"


@dataclass(frozen=True)
class Spec:
    """One job the soak tried to enqueue."""

    task_key: str
    kind: str  # noop | sleep | flaky | doomed
    via: str  # api | cli
    max_attempts: int
    after: tuple[str, ...] = ()  # task_keys of its parents (enqueue after=)
    on_parent_failure: str = "cancel"
    batch: str | None = None  # a member of this batch


@dataclass(frozen=True)
class Row:
    id: int
    task_key: str
    status: str
    attempts: int
    max_attempts: int
    last_error: str | None


@dataclass(frozen=True)
class Execution:
    """One line of the execution log: a handler that did its work."""

    task_key: str
    attempt: int
    worker: str
    pid: int


@dataclass
class Observed:
    specs: dict[str, Spec]  # every task_key we tried to enqueue
    acked: dict[str, int]  # task_key -> id the queue acknowledged
    rows: list[Row]  # job_queue at the end
    results: list[tuple[str, int, int]]  # job_result: (task_key, job_id, attempt)
    attempt_rows: list[tuple[int, int, str, str]]  # job_attempt: (job_id, attempt, outcome, error)
    executions: list[Execution]
    attempts_backwards: list[dict[str, Any]] = field(default_factory=list)  # from the monitor
    terminal_regressions: list[dict[str, Any]] = field(default_factory=list)  # from the monitor
    cancelled: set[str] = field(default_factory=set)  # task_keys the soak cancelled (answered changed)
    # task_keys a cancel was sent for whose effect is not known: no answer, a 5xx (a COMMIT may
    # have landed whose OK never came), or "already cancelled" after one of those.
    cancel_unknown: set[str] = field(default_factory=set)
    paused_claims: list[dict[str, Any]] = field(default_factory=list)  # from the monitor: claims while paused
    killed_pids: set[int] = field(default_factory=set)
    stopped_pids: set[int] = field(default_factory=set)
    terminated_pids: set[int] = field(default_factory=set)
    partitioned_pids: set[int] = field(default_factory=set)
    forced: set[tuple[str, int]] = field(default_factory=set)  # (task_key, attempt) requeued while running
    # (task_key, attempt) -> why it was superseded, when the caller knows better than the pids
    # (the failover drill: an attempt in flight when the primary died).
    explained: dict[tuple[str, int], str] = field(default_factory=dict)
    # Workflows (the soak): task_key -> (first claimed, finished) by the database's clock; the
    # job_batch rows by key (BATCH_COLUMNS); the batches the soak opened, and closed.
    times: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    batches_opened: set[str] = field(default_factory=set)
    batches_closed: set[str] = field(default_factory=set)


@dataclass
class Findings:
    """Counts (and a few examples) for the report; `violations` decides the verdict."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[Any]] = field(default_factory=dict)
    by_kind: dict[str, Counter] = field(default_factory=dict)
    duplicate_causes: Counter = field(default_factory=Counter)
    unexpected_failures: Counter = field(default_factory=Counter)  # reason (first line) -> n

    # What must be zero for a pass, with how the report names it.
    MUST_BE_ZERO = {
        "lost": "acknowledged jobs not done/failed (lost)",
        "extra_rows": "rows nobody enqueued (a replay made a job?)",
        "duplicate_results": "task_keys with more than one result row",
        "results_not_done": "result rows of jobs that are not done",
        "done_without_result": "done jobs without a result row",
        "doomed_not_failed": "doomed jobs not failed, or with a result",
        "failed_without_error": "failed jobs without last_error",
        "attempts_over_max": "jobs with attempts > max_attempts",
        "attempts_backwards": "attempts that went backwards (monitor)",
        "terminal_regressions": "done/failed/cancelled jobs that changed status again (monitor)",
        "cancelled_unasked": "cancelled jobs the soak never cancelled",
        "cancel_undone": "jobs the soak cancelled (changed: true) that are not cancelled",
        "claims_while_paused": "jobs claimed from the paused queue 2 s or more after the pause (monitor)",
        "double_claims": "the same attempt of a job executed twice",
        "attempt_history_gaps": "jobs whose unsuccessful attempts are not all in job_attempt",
        "executions_unknown": "executions of task_keys the table does not have",
        "done_without_execution": "done jobs the execution log never saw succeed",
        "started_before_parents": "dependent jobs first claimed before a parent had finished",
        "ran_despite_failed_parent": "dependent jobs (on_parent_failure cancel) not cancelled though a parent failed",
        "children_not_settled": "dependent jobs finished while a parent was not",
        "batches_not_finished": "batches the soak opened and closed that did not finish",
        "batch_counts_wrong": "batches whose counters differ from their members' statuses",
        "callbacks_missing": "callbacks a finished batch called for that were not enqueued, or not done",
        "callbacks_unexpected": "callbacks enqueued that their batch's outcome did not call for",
        "duplicate_callbacks": "callbacks enqueued more than once (rows or ids that differ from the batch's)",
    }

    def add(self, name: str, example: Any = None, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n
        if example is not None and len(self.examples.setdefault(name, [])) < 5:
            self.examples[name].append(example)

    def get(self, name: str) -> int:
        return self.counts.get(name, 0)

    def violations(self) -> dict[str, int]:
        return {name: self.get(name) for name in self.MUST_BE_ZERO if self.get(name)}


def check(obs: Observed) -> Findings:
    f = Findings()
    for name in Findings.MUST_BE_ZERO:
        f.counts.setdefault(name, 0)
    by_key = {r.task_key: r for r in obs.rows}
    # The jobs the soak cancelled: answered so, or asked with the answer lost and cancelled now.
    cancelled = obs.cancelled | {k for k in obs.cancel_unknown if k in by_key and by_key[k].status == "cancelled"}

    # --- what goes in must come out --------------------------------------------------------------
    for key, job_id in obs.acked.items():
        row = by_key.get(key)
        if row is None:
            f.add("lost", f"{key}: acknowledged as id {job_id}, not in job_queue")
        elif row.status not in TERMINAL:
            f.add("lost", f"{key}: still {row.status} after the drain (attempts {row.attempts})")
        elif row.id != job_id:
            f.add("lost", f"{key}: acknowledged as id {job_id}, the table has id {row.id}")
    f.counts["unacknowledged_in_table"] = sum(1 for k in obs.specs if k not in obs.acked and k in by_key)
    f.counts["unacknowledged_missing"] = sum(1 for k in obs.specs if k not in obs.acked and k not in by_key)
    for row in obs.rows:
        if row.task_key not in obs.specs and not _callback_of(row.task_key, obs.batches_opened):
            f.add("extra_rows", f"{row.task_key} (id {row.id}, {row.status})")

    # --- statuses, reasons, attempts -------------------------------------------------------------
    for row in obs.rows:
        spec = obs.specs.get(row.task_key)
        kind = spec.kind if spec else "callback" if row.task_key.startswith(CALLBACK_PREFIX) else "?"
        f.by_kind.setdefault(kind, Counter())[row.status] += 1
        if row.status == "failed" and not (row.last_error or "").strip():
            f.add("failed_without_error", f"{row.task_key} (id {row.id})")
        if row.attempts > row.max_attempts:
            f.add("attempts_over_max", f"{row.task_key}: attempts {row.attempts} > max {row.max_attempts}")
        if spec and spec.kind == "doomed" and row.status not in ("failed", "cancelled"):
            f.add("doomed_not_failed", f"{row.task_key} is {row.status}")
        if row.status == "cancelled" and row.task_key not in cancelled:
            if _cancelled_by_parent(row, spec, by_key):
                f.add("cancelled_by_parent")
            else:
                f.add("cancelled_unasked", f"{row.task_key} (id {row.id})")
        if spec and spec.kind != "doomed" and row.status == "failed":
            f.unexpected_failures[_first_line(row.last_error)] += 1
        if spec and row.max_attempts > spec.max_attempts:
            f.add("max_attempts_raised")  # a release on shutdown gave a last attempt one more
    f.counts["failed_not_doomed"] = sum(f.unexpected_failures.values())
    for key in obs.cancelled:
        row = by_key.get(key)
        if row is None or row.status != "cancelled":
            f.add("cancel_undone", f"{key}: cancelled, now {row.status if row else 'missing'}")
    f.counts["cancelled"] = sum(1 for r in obs.rows if r.status == "cancelled")
    f.counts["cancelled_answer_lost"] = len(cancelled - obs.cancelled)

    # --- results: one per done task_key, none for anything else ----------------------------------
    results_by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, job_id, attempt in obs.results:
        results_by_key[key].append((job_id, attempt))
    # Attempts taken back while they ran: by the reaper (the lease ran out) or by an operator's
    # forced requeue.
    taken_back = {
        (job_id, attempt)
        for job_id, attempt, outcome, _ in obs.attempt_rows
        if outcome in ("lease_expired", "requeued")
    }
    for key, result_attempts in results_by_key.items():
        n = len(result_attempts)
        if n > 1:
            f.add("duplicate_results", f"{key}: {n} result rows")
        row = by_key.get(key)
        # A job cancelled while it ran may have recorded its result first: its work was done.
        # So may one whose every attempt died: the result is recorded under the lease in a
        # transaction of its own, before the completion; an attempt that recorded it and then
        # lost its lease (taken back by the reaper, or by an operator's forced requeue) left it,
        # and if no later attempt lived to complete, the job failed with its attempts used up by
        # expired leases.
        died_after_recording = (
            row is not None
            and row.status == "failed"
            and (row.last_error or "").startswith("lease expired")
            and all(pair in taken_back for pair in result_attempts)
        )
        if row is None or (row.status not in ("done", "cancelled") and not died_after_recording):
            f.add("results_not_done", f"{key}: result row but job is {row.status if row else 'missing'}")
        elif died_after_recording:
            f.add(
                "results_of_reaped_attempts",
                f"{key}: recorded by attempt {result_attempts[0][1]}, then taken back; later attempts died too",
            )
        spec = obs.specs.get(key)
        if spec and spec.kind == "doomed":
            f.add("doomed_not_failed", f"{key} has a result")
    for row in obs.rows:
        if row.status == "done" and row.task_key not in results_by_key:
            f.add("done_without_result", f"{row.task_key} (id {row.id})")

    # --- attempts never lost: every attempt that did not succeed is in job_attempt ---------------
    history: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    for job_id, attempt, outcome, error in obs.attempt_rows:
        history[job_id].append((attempt, outcome, error))
    for row in obs.rows:
        if row.status not in TERMINAL:
            continue
        expected = set(range(1, row.attempts + (0 if row.status == "done" else 1)))
        seen = [a for a, _, _ in history.get(row.id, [])]
        if sorted(seen) != sorted(expected):
            f.add(
                "attempt_history_gaps",
                f"{row.task_key}: {row.status} after {row.attempts} attempts, job_attempt has {sorted(seen)}",
            )
    f.counts["attempt_rows"] = len(obs.attempt_rows)

    # --- executions: duplicates are counted and explained; the same attempt twice is a bug -------
    per_key: dict[str, list[Execution]] = defaultdict(list)
    for ex in obs.executions:
        per_key[ex.task_key].append(ex)
    pairs = Counter((ex.task_key, ex.attempt) for ex in obs.executions)
    for (key, attempt), n in pairs.items():
        if n > 1:
            f.add("double_claims", f"{key} attempt {attempt} executed {n} times")
    outcome_of = {(job_id, attempt): (outcome, error) for job_id, attempt, outcome, error in obs.attempt_rows}
    duplicated_keys = extra = 0
    for key, runs in per_key.items():
        row = by_key.get(key)
        if row is None:
            f.add("executions_unknown", key)
            continue
        if len(runs) < 2:
            continue
        duplicated_keys += 1
        extra += len(runs) - 1
        # The run that completed the job is the last attempt; every other run was superseded.
        for ex in runs:
            if row.status == "done" and ex.attempt == row.attempts:
                continue
            f.duplicate_causes[_cause(ex, outcome_of.get((row.id, ex.attempt)), obs)] += 1
    f.counts["duplicate_executions"] = duplicated_keys
    f.counts["extra_executions"] = extra
    f.counts["executions"] = len(obs.executions)
    succeeded = {(ex.task_key, ex.attempt) for ex in obs.executions}
    for row in obs.rows:
        if row.status == "done" and (row.task_key, row.attempts) not in succeeded:
            f.add("done_without_execution", f"{row.task_key} done at attempt {row.attempts}")

    check_workflows(obs, f, by_key, per_key, cancelled)

    # --- the monitor's view while it ran ---------------------------------------------------------
    for item in obs.attempts_backwards:
        f.add("attempts_backwards", item)
    for item in obs.terminal_regressions:
        f.add("terminal_regressions", item)
    for item in obs.paused_claims:
        f.add("claims_while_paused", item)
    return f


def check_workflows(
    obs: Observed, f: Findings, by_key: dict[str, Row], per_key: dict[str, list[Execution]], cancelled: set[str]
) -> None:
    """Dependent jobs ran only after their parents finished, and were settled as their parents'
    outcomes say; each batch finished with its members' counts and its callbacks enqueued
    exactly once, as its outcome calls for."""
    failed_like = ("failed", "cancelled")
    dependent = [(by_key.get(k), s) for k, s in obs.specs.items() if s.after]
    f.counts["dependent_jobs"] = len(dependent)
    for row, spec in dependent:
        if row is None or row.status not in TERMINAL:
            continue  # lost: counted above
        parents = [by_key.get(p) for p in spec.after]
        if any(p is None or p.status not in TERMINAL for p in parents):
            f.add("children_not_settled", f"{row.task_key} is {row.status}, a parent is not finished")
            continue
        first, _ = obs.times.get(row.task_key, (None, None))
        # A parent the soak cancelled after it finished (a failed one) has a later finished_at
        # than the moment it released its children: left out of the comparison.
        finished = [obs.times.get(p.task_key, (None, None))[1] for p in parents if p.task_key not in cancelled]
        if first is not None and any(t is not None and first < t for t in finished):
            f.add("started_before_parents", f"{row.task_key} first claimed {first}, a parent finished {max(finished)}")
        failed = [p for p in parents if p.status in failed_like]
        # A failed or cancelled parent cancels a child waiting with on_parent_failure cancel in
        # the transaction that finished the parent (a done parent never changes again).
        if spec.on_parent_failure == "cancel" and failed and row.status != "cancelled":
            f.add(
                "ran_despite_failed_parent",
                f"{row.task_key} {row.status}; parents {[(p.task_key, p.status) for p in failed]}",
            )

    callbacks = Counter()
    runs = Counter()
    for key in obs.batches_opened:
        batch = obs.batches.get(key)
        members = [by_key.get(k) for k, s in obs.specs.items() if s.batch == key and k in obs.acked]
        if batch is None:
            f.add("batches_not_finished", f"{key}: no job_batch row")
            continue
        if key not in obs.batches_closed:
            continue  # its close never went through: reported as an enqueue problem
        statuses = Counter(m.status for m in members if m is not None)
        counted = {s: batch[s] for s in ("done", "failed", "cancelled")}
        if batch["total"] != len(members) or any(counted[s] != statuses.get(s, 0) for s in counted):
            f.add("batch_counts_wrong", f"{key}: batch says {batch['total']} {counted}, members {dict(statuses)}")
        if batch["state"] != "finished":
            f.add("batches_not_finished", f"{key}: {batch['state']}, members {dict(statuses)}")
            continue
        # What its members' outcomes call for: success when all are done, complete always,
        # failure when one failed (or was failed and then cancelled by the soak: it fired then).
        required = {"complete"} | ({"success"} if statuses.get("done", 0) == len(members) else set())
        required |= {"failure"} if statuses.get("failed") else set()
        allowed = required | ({"failure"} if any(m is not None and m.task_key in cancelled for m in members) else set())
        for kind in ("success", "failure", "complete"):
            cb_key = f"{CALLBACK_PREFIX}{key}:{kind}"
            row = by_key.get(cb_key)
            job_id = batch[f"{kind}_job_id"]
            if row is not None:
                callbacks[kind] += 1
                runs[kind] += len(per_key.get(cb_key, []))
                if job_id != row.id:
                    f.add("duplicate_callbacks", f"{cb_key}: row id {row.id}, the batch names {job_id}")
                if kind not in allowed:
                    f.add("callbacks_unexpected", f"{cb_key} ({row.status}); members {dict(statuses)}")
                elif row.status != "done":
                    f.add("callbacks_missing", f"{cb_key} is {row.status}")
            elif kind in required:
                f.add("callbacks_missing", f"{cb_key}: not enqueued; members {dict(statuses)}")
            elif job_id is not None:
                f.add("duplicate_callbacks", f"{cb_key}: the batch names job {job_id}, no such row")
    f.counts["batches"] = len(obs.batches_opened)
    f.counts["callbacks"] = sum(callbacks.values())
    f.counts["callback_executions"] = sum(runs.values())
    f.counts.update({f"callbacks_{kind}": n for kind, n in callbacks.items()})


def _callback_of(task_key: str, batches: set[str]) -> bool:
    if not task_key.startswith(CALLBACK_PREFIX):
        return False
    key, _, kind = task_key[len(CALLBACK_PREFIX) :].rpartition(":")
    return key in batches and kind in ("success", "failure", "complete")


def _cancelled_by_parent(row: Row, spec: Spec | None, by_key: dict[str, Row]) -> bool:
    """A dependent job cancelled because a parent failed or was cancelled (its last_error names it)."""
    if spec is None or spec.on_parent_failure != "cancel" or not (row.last_error or "").startswith("parent "):
        return False
    parent = (row.last_error or "").split(" ")[1]
    return parent in spec.after and by_key.get(parent) is not None and by_key[parent].status in ("failed", "cancelled")


def _cause(ex: Execution, attempt_row: tuple[str, str] | None, obs: Observed) -> str:
    """Why a run did not count: its process was killed or stopped, or the database let it down."""
    if (ex.task_key, ex.attempt) in obs.forced:
        return "an operator force-requeued it while it ran"
    if ex.pid in obs.killed_pids:
        return "process SIGKILLed"
    if ex.pid in obs.stopped_pids:
        return "process SIGSTOPped past its lease"
    if ex.pid in obs.terminated_pids:
        return "process SIGTERMed (job released)"
    if (ex.task_key, ex.attempt) in obs.explained:
        return obs.explained[(ex.task_key, ex.attempt)]
    if attempt_row is None:
        return "no attempt record"
    outcome, error = attempt_row
    first = _first_line(error)
    if outcome == "lease_expired":
        if ex.pid in obs.partitioned_pids:
            return "its worker was cut off from the database past its lease"
        return "lease expired (completion could not reach the database)"
    if outcome == "retry":
        return f"retried: {first[:80]}"
    return f"{outcome}: {first[:80]}"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "(no error)"


def read_executions(path) -> list[Execution]:
    """The execution log soak/tasks.py writes: one "task_key attempt worker pid" line a run."""
    out = []
    for line in path.read_text().splitlines():
        key, attempt, worker, pid = line.split(" ")
        out.append(Execution(key, int(attempt), worker, int(pid)))
    return out
