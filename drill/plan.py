"""What the drill runs: its plan (quick and full), the job mix, and the seeded fault schedule."""

from __future__ import annotations

import random
from dataclasses import dataclass

from soak.checks import Spec

DB_NAME = "drill"
LEASE_SECONDS = 5
FAULT_KINDS = ("sigkill_worker", "sigkill_web_worker", "link_down", "replay", "failover")


@dataclass
class Plan:
    jobs: int = 20_000
    cli_jobs: int = 200
    hosts: int = 3
    web_workers: int = 2
    embedded_workers: int = 2
    concurrency: int = 4
    window_seconds: float = 300.0  # enqueues spread over it (at most: a busy machine is slower); faults inside it
    failover_at: float = 0.6  # fraction of the window
    worker_kills: int = 6
    web_kills: int = 2
    link_downs: int = 2
    link_down_seconds: float = 2 * LEASE_SECONDS + 2
    replays: int = 3
    replay_api_keys: int = 30
    replay_cli_keys: int = 3
    kills_after_failover: int = 1
    api_threads_per_host: int = 3
    cli_threads_per_host: int = 2  # a CLI enqueue is a process start: seconds each on a busy machine
    grace_seconds: float = 8.0
    drain_timeout: float = 300.0
    server: str = "mariadb"  # the throwaway servers' flavour: mariadb, mysql, mariadb11

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            jobs=1500,
            cli_jobs=24,
            window_seconds=60.0,
            worker_kills=2,
            web_kills=1,
            link_downs=1,
            replays=1,
            replay_api_keys=15,
            replay_cli_keys=1,
            drain_timeout=120.0,
            api_threads_per_host=2,
        )


def job_specs(plan: Plan, rng: random.Random) -> list[tuple[Spec, dict]]:
    """(spec, payload) per job, the CLI ones spread evenly among the API ones."""
    out = []
    cli_every = max(1, plan.jobs // max(1, plan.cli_jobs)) if plan.cli_jobs else 0
    for i in range(plan.jobs):
        kind = rng.choices(("noop", "sleep", "flaky", "doomed"), weights=(45, 35, 12, 8))[0]
        payload: dict = {"kind": kind}
        if kind == "sleep":
            # A few outlast the lease (5 s): their leases must be renewed through the faults.
            payload["seconds"] = round(rng.uniform(5.5, 7.0) if rng.random() < 0.03 else rng.uniform(0.01, 0.3), 3)
        elif kind == "flaky":
            payload["fail_times"] = rng.randint(1, 2)
        via = "cli" if cli_every and i % cli_every == 0 and i // cli_every < plan.cli_jobs else "api"
        out.append((Spec(f"drill-{i:06d}-{kind}", kind, via, 2 if kind == "doomed" else 4), payload))
    return out


def fault_schedule(plan: Plan, rng: random.Random) -> list[tuple[float, str]]:
    """(seconds into the window, fault), sorted; the failover at plan.failover_at, the rest of the
    faults before it (so each is judged on its own), a few SIGKILLs after it."""
    window, failover = plan.window_seconds, plan.window_seconds * plan.failover_at
    before = failover - plan.link_down_seconds - 4
    events = [(failover, "failover")]
    for kind, n in (
        ("sigkill_worker", plan.worker_kills),
        ("sigkill_web_worker", plan.web_kills),
        ("link_down", plan.link_downs),
        ("replay", plan.replays),
    ):
        for j in range(n):
            lo, hi = before * (0.1 + 0.9 * j / n), before * (0.1 + 0.9 * (j + 1) / n)
            events.append((rng.uniform(lo, hi), kind))
    for _ in range(plan.kills_after_failover):
        events.append((rng.uniform(failover + 8, max(failover + 9, window * 0.85)), "sigkill_worker"))
    return sorted(events)
