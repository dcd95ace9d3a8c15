"""What the soak runs: its plan (quick and full), the job mix, and the seeded fault schedule. The
same seed gives the same jobs and the same schedule."""

from __future__ import annotations

import random
from dataclasses import dataclass

from soak.checks import Spec

DB_NAME = "soak"
LEASE_SECONDS = 3
FAULT_KINDS = (
    "sigkill_worker",
    "sigterm_worker",
    "sigstop_worker",
    "kill_connection",
    "db_restart",
    "hold_rows",
    "sigkill_web_worker",
    "replay",
    "force_requeue",
    "read_only_flip",
    "partition_worker",
    "pause_queue",
    "cancel",
    "take_back_prefetched",
    "pause_stalled_claim",
    "two_primaries",
)
QUEUE = "default"
PAUSE_NOTICE_SECONDS = 2.0  # a pause takes effect in every process within this (docs/operations.md: about a second)


@dataclass
class Plan:
    jobs: int = 10_000
    cli_jobs: int = 250
    fault_seconds: float = 240.0
    workers: int = 3
    concurrency: int = 4
    web_workers: int = 2
    embedded_workers: int = 2
    api_threads: int = 4
    cli_threads: int = 2
    kill_every: tuple[float, float] = (3.0, 6.0)
    stops: int = 3
    stop_seconds: float = 2 * LEASE_SECONDS
    conn_kill_every: tuple[float, float] = (1.5, 4.0)
    conn_kills_each: tuple[int, int] = (1, 3)
    restart_at: float = 0.45  # fraction of the fault window
    restart_down_seconds: float = 1.5
    crash_db: bool = False  # SIGKILL the server instead of a clean stop
    server: str = "mariadb"  # the throwaway server's flavour: mariadb, mysql, mariadb11
    holds: int = 3
    hold_rows: int = 5
    hold_seconds: float = 5.0
    web_kills: int = 2
    graceful_restarts: int = 3
    grace_seconds: float = 8.0  # longer than the lease: renewals must go on through it
    force_requeues: int = 6  # an operator's forced requeue of a running job
    read_only_flips: int = 2  # the primary turned read-only for a moment
    read_only_seconds: float = 2.0
    partitions: int = 2  # one worker cut off from the database past its lease
    partition_seconds: float = 2 * LEASE_SECONDS + 1
    replays: int = 5
    pauses: int = 3
    pause_seconds: float = 6.0
    cancels: int = 5
    cancel_api_keys: int = 20
    cancel_cli_keys: int = 2
    take_backs: int = 3  # an operator's action on a job prefetched, not started
    stalled_pauses: int = 2  # a pause sent while claims stall in their transaction
    replay_api_keys: int = 40
    replay_cli_keys: int = 2
    drain_timeout: float = 600.0
    two_primaries: int = 1  # a twin made writable in one worker's candidate list
    two_primaries_seconds: float = 12.0
    # Workflows, enqueued one group at a time through the API over the first part of the fault
    # window: chains (each job after the one before), fan-ins (one job after several), batches
    # with their three callbacks.
    chains: int = 30
    chain_length: int = 4
    fan_ins: int = 30
    fan_in_parents: int = 3
    batches: int = 30
    batch_members: int = 8

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            jobs=1200,
            cli_jobs=30,
            fault_seconds=30.0,
            kill_every=(3.0, 5.0),
            stops=1,
            pauses=2,
            pause_seconds=4.0,
            cancels=2,
            cancel_api_keys=10,
            cancel_cli_keys=1,
            conn_kill_every=(2.0, 4.0),
            holds=2,
            web_kills=1,
            graceful_restarts=1,
            replays=2,
            replay_api_keys=20,
            replay_cli_keys=1,
            drain_timeout=60.0,
            force_requeues=2,
            read_only_flips=1,
            partitions=1,
            take_backs=2,
            stalled_pauses=1,
            chains=4,
            chain_length=3,
            fan_ins=4,
            batches=6,
            batch_members=5,
        )


def job_specs(plan: Plan, rng: random.Random) -> list[tuple[Spec, dict, float]]:
    """(spec, payload, delay) for each job, the CLI ones spread evenly among the API ones."""
    out = []
    cli_every = max(1, plan.jobs // max(1, plan.cli_jobs)) if plan.cli_jobs else 0
    for i in range(plan.jobs):
        kind = rng.choices(("noop", "sleep", "flaky", "doomed"), weights=(40, 30, 20, 10))[0]
        payload: dict = {"kind": kind}
        if kind == "sleep":
            # Mostly short; a few outlast the lease (3 s) but not the shutdown grace (8 s), so a
            # SIGTERM must keep renewing them to the end; a very few outlast the grace too, and
            # are released (their handlers told, and stopping).
            r = rng.random()
            payload["seconds"] = round(
                rng.uniform(8.5, 10.0) if r < 0.004 else rng.uniform(3.5, 6.0) if r < 0.05 else rng.uniform(0.01, 0.4),
                3,
            )
        elif kind == "flaky":
            payload["fail_times"] = rng.randint(1, 2)
        max_attempts = 2 if kind == "doomed" else 4
        delay = round(rng.uniform(0.2, 2.0), 2) if rng.random() < 0.05 else 0.0
        via = "cli" if cli_every and i % cli_every == 0 and i // cli_every < plan.cli_jobs else "api"
        out.append((Spec(f"soak-{i:06d}-{kind}", kind, via, max_attempts), payload, delay))
    return out


CALLBACK_TASK = "soak_callback"


@dataclass
class Group:
    """A workflow enqueued in order by one thread: its jobs (parents before children), and for a
    batch its key, opened before and closed after its members."""

    name: str
    jobs: list[tuple[Spec, dict]]
    batch: str | None = None


def _workflow_job(rng: random.Random, key: str, doomed_weight: int, **options) -> tuple[Spec, dict]:
    kind = rng.choices(("noop", "sleep", "flaky", "doomed"), weights=(40, 30, 30 - doomed_weight, doomed_weight))[0]
    payload: dict = {"kind": kind}
    if kind == "sleep":
        payload["seconds"] = round(rng.uniform(0.01, 0.4), 3)
    elif kind == "flaky":
        payload["fail_times"] = rng.randint(1, 2)
    return Spec(f"{key}-{kind}", kind, "api", 2 if kind == "doomed" else 4, **options), payload


def workflow_groups(plan: Plan, rng: random.Random) -> list[Group]:
    """Chains, fan-ins and batches, shuffled (the same seed, the same groups). A chain's jobs wait
    each for the one before (on_parent_failure cancel: a doomed link cancels the rest); a fan-in's
    last job waits for all the others (cancel, or run: it runs whatever they did); a batch's
    members sometimes include a doomed one, which calls its on_failure."""
    groups: list[Group] = []
    for g in range(plan.chains):
        jobs: list[tuple[Spec, dict]] = []
        for i in range(plan.chain_length):
            after = (jobs[-1][0].task_key,) if jobs else ()
            jobs.append(_workflow_job(rng, f"wf-chain{g:03d}-{i}", 5, after=after))
        groups.append(Group(f"chain{g:03d}", jobs))
    for g in range(plan.fan_ins):
        parents = [_workflow_job(rng, f"wf-fan{g:03d}-p{i}", 10) for i in range(plan.fan_in_parents)]
        mode = rng.choice(("cancel", "run"))
        child = _workflow_job(
            rng, f"wf-fan{g:03d}-join", 0, after=tuple(p[0].task_key for p in parents), on_parent_failure=mode
        )
        groups.append(Group(f"fan{g:03d}", [*parents, child]))
    for g in range(plan.batches):
        key = f"soakb{g:03d}"
        weight = 10 if g % 2 else 0  # every other batch may fail
        groups.append(
            Group(
                key, [_workflow_job(rng, f"wf-{key}-m{i}", weight, batch=key) for i in range(plan.batch_members)], key
            )
        )
    rng.shuffle(groups)
    return groups


def fault_schedule(plan: Plan, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds into the fault window, fault kind), sorted: the same seed, the same schedule."""
    window = plan.fault_seconds
    events: list[tuple[float, str]] = []
    t = rng.uniform(*plan.kill_every) / 2
    while t < window:
        events.append((t, "sigkill_worker"))
        t += rng.uniform(*plan.kill_every)
    t = rng.uniform(*plan.conn_kill_every)
    while t < window:
        events.append((t, "kill_connection"))
        t += rng.uniform(*plan.conn_kill_every)
    events.append((window * plan.restart_at, "db_restart"))
    # Stops, holds and web kills land while the queue is busy, away from the restart and the end.
    for kind, n in (
        ("sigstop_worker", plan.stops),
        ("hold_rows", plan.holds),
        ("sigkill_web_worker", plan.web_kills),
        ("sigterm_worker", plan.graceful_restarts),
        ("replay", plan.replays),
        ("force_requeue", plan.force_requeues),
        ("read_only_flip", plan.read_only_flips),
        ("partition_worker", plan.partitions),
        ("pause_queue", plan.pauses),
        ("cancel", plan.cancels),
        ("take_back_prefetched", plan.take_backs),
        ("pause_stalled_claim", plan.stalled_pauses),
    ):
        for j in range(n):
            lo, hi = window * (0.05 + 0.8 * j / n), window * (0.05 + 0.8 * (j + 1) / n)
            at = rng.uniform(lo, hi)
            if abs(at - window * plan.restart_at) < 4:
                at = (at + 5) if at >= window * plan.restart_at else (at - 5)
            events.append((max(0.5, min(at, window - plan.stop_seconds - 1)), kind))
    for _ in range(plan.two_primaries):  # after the others: the same seed keeps their schedule
        events.append((two_primaries_start(events, plan, rng), "two_primaries"))
    return sorted(events)


def two_primaries_start(events: list[tuple[float, str]], plan: Plan, rng: random.Random) -> float:
    """When a two_primaries spell may start: away from read-only flips and server restarts, each of
    which would leave the twin the only writable candidate (a real failover to it, where claiming
    on the twin is right), and after the twin server had time to start."""
    window = plan.fault_seconds
    span = plan.two_primaries_seconds + 5  # the twin's worker may take a few seconds to start
    busy = [t for t, kind in events if kind in ("read_only_flip", "db_restart", "two_primaries")]
    lo = max(15.0, window * 0.05)  # the twin and its worker start meanwhile
    for _ in range(200):
        at = rng.uniform(lo, max(lo, window * 0.9))
        if not any(at - 8 <= t <= at + span for t in busy):
            return at
    return max([window] + busy) + 8
