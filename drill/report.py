"""The drill's table and docs/scale-out.md: the verdict with its figures, the throughput steps with
their plot, and the arithmetic for bigger machines."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

from drill.topology import SEMI_SYNC_TIMEOUT_MS
from soak.checks import Execution, Observed, _cause
from soak.report import by_kind, failed_not_doomed, listed, markdown_table, monitor_rows, outcome_rows
from testkit.throwaway import FLAVOURS, describe_flavour


def table(n: dict) -> str:
    f = n.get("failover") or {}
    rows = [
        (
            "jobs enqueued",
            f"{n['jobs']} from {n['hosts']} hosts ({n['jobs_api']} via HTTP API, {n['jobs_cli']} via CLI), "
            f"{n['acked']} acknowledged",
        ),
        ("jobs by kind (final status)", by_kind(n)),
        ("faults injected", f"{listed(n['faults'])}; {n['replayed_keys']} task_keys replayed"),
        *outcome_rows(n),
    ]
    if f:
        rows += [
            (
                "failover: replica promoted (by the drill)",
                f"writable {f['writable_seconds']} s after the primary's SIGKILL "
                f"(promote() returned at {f['promoted_seconds']} s); old primary back "
                f"as a read-only replica at {f['demoted_seconds']} s"
                + (
                    f", rebuilt by CLONE: it held {f['old_primary_rebuilt_without']}"
                    " (binlogged, never acknowledged by the replica)"
                    if f.get("old_primary_rebuilt_without")
                    else ""
                ),
            ),
            (
                "**failover: first claim on the new primary**",
                f"{f['first_claim_seconds']} s after the primary died, "
                f"{f['first_claim_after_writable_seconds']} s after the new one "
                "turned writable",
            ),
            (
                "failover: first enqueue acknowledged after it",
                f"{f['first_ack_seconds']} s after the primary died "
                f"(longest silence between acknowledgements around it {f['enqueue_gap_seconds']} s)",
            ),
            (
                "failover: processes that found the new primary",
                f"{f['processes_claiming_on_new_primary']} of "
                f"{f['processes_through_failover']} that lived through it claimed there "
                f"(median first claim {f['median_process_first_claim_seconds']} s, "
                f"slowest {f['slowest_process_first_claim_seconds']} s after the kill)"
                + (
                    f"; never: {', '.join(f['processes_never_claimed_on_new_primary'])}"
                    if f["processes_never_claimed_on_new_primary"]
                    else ""
                ),
            ),
        ]
    for w in n.get("read_only") or []:
        rows.append(
            (
                f"**on {w['server']}**",
                f"{w['claim_updates']} claims took rows, {w['writes']} writes received (must be 0); "
                f"{w['claims']} claim SELECTs received (refused by read_only: error 1290); "
                f"{w['statements']} statements from the application in all",
            )
        )
    b = n.get("binlog")
    if b:
        rows.append(
            (
                "**binlogs: transactions written while read-only**",
                f"{b['own_before_promotion']} by db2 before its promotion, {b['extra_on_old_primary']} by db1 "
                f"after its demotion (must be 0); transactions by origin: {json.dumps(b['gtids'], sort_keys=True)}",
            )
        )
    rows += [
        *monitor_rows(n),
        ("failed but not doomed", failed_not_doomed(n)),
        (
            "duration",
            f"{n['duration_seconds']} s (enqueue {n['enqueue_seconds']} s, {n['throughput_overall']} jobs/s "
            f"overall; set-up {n['setup_seconds']} s)",
        ),
        ("exit codes after SIGTERM", listed(n["exit_codes"])),
        ("problems", ", ".join(f"{k}={v}" for k, v in n["problems"].items()) or "none"),
    ]
    return markdown_table(rows)


def markdown(outcome, command: str, plan, docs_dir: Path) -> str:
    n = outcome.numbers
    when = n.get("finished_at") or datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    f = n.get("failover") or {}
    semi = f.get("semi_sync_before_kill", {})
    mysql = FLAVOURS[plan.server].mysql
    source, monitor = ("source", "REPLICATION CLIENT") if mysql else ("master", "SLAVE MONITOR")
    throughput = ""
    if n.get("throughput"):
        from drill.throughput import arithmetic, plot, steps_table

        image = plot(
            n["throughput"],
            docs_dir
            / ("scale-out-throughput.png" if plan.server == "mariadb" else f"scale-out-{plan.server}-throughput.png"),
        )
        throughput = f"""
## Throughput against application hosts

{steps_table(n["throughput"])}

![jobs per second against application hosts, with the primary's commits and CPU]({image.name})

{arithmetic(n["throughput"])}
"""
    others = (
        ""
        if plan.server != "mariadb"
        else "\nThe same drill with MySQL servers (`--server mysql`): [scale-out-mysql.md](scale-out-mysql.md).\n"
    )
    title = "" if plan.server == "mariadb" else f" ({plan.server})"
    return f"""# Scale-out and failover drill{title}: last result
{others}
`{command}` on {when} ({platform.machine()}, {os.cpu_count()} cores shared with other work: load
average {n["load_average_1min"][0]} at the start, {n["load_average_1min"][1]} at the end; Python
{platform.python_version()}, {describe_flavour(plan.server)}),
seed {n["seed"]}.

**{outcome.verdict}**

{outcome.table}

## What ran

Every machine is a network namespace on one bridge (`testkit.netns`): `db1` and `db2` run a
throwaway {plan.server} server each, `db1` the GTID primary and `db2` its semi-synchronous replica
(`--read-only`, AFTER_SYNC, a {SEMI_SYNC_TIMEOUT_MS // 1000}-second ack timeout so that the primary never falls back to
asynchronous replication unnoticed: commits without an ack before the kill,
`Rpl_semi_sync_{source}_no_tx`, were {semi.get("no_tx", "?")} against
{semi.get("yes_tx", "?")} acknowledged). `app1`..`app{plan.hosts}` run gunicorn
({plan.web_workers} web processes with {plan.embedded_workers} embedded workers each, and the
reaper) and a standalone `jobqueue worker --concurrency {plan.concurrency} --lease-seconds 5`,
all configured with the same two candidate URLs, `JOBQUEUE_DATABASE_URL="<db1> <db2>"`, as the
account `jq_app` (SELECT, INSERT, UPDATE, DELETE on its database and {monitor}: no SUPER, so
`read_only` binds it; see docs/deploy.md). The schema was created by `jq_migrate`.

Jobs were enqueued at an even pace over {plan.window_seconds:g} s, or as fast as the hosts answered
when that was slower (the enqueue took {n["enqueue_seconds"]} s), through `POST /api/jobs` on the
three hosts in turn and through `jobqueue enqueue` run on the hosts, each retried with the same
`task_key` on 5xx, connection errors and exit codes 1 and 75 (and sent to another host when one
did not answer). Faults on a seeded schedule: SIGKILL of standalone workers (a new one started at
once), SIGKILL of a gunicorn worker (its master starts another), a host's link taken down for
{plan.link_down_seconds:g} s (the lease is 5 s), replays of known `task_key`s through both doors;
then, at {plan.failover_at:.0%} of the window, the failover: SIGKILL of `db1`, `promote()` of
`db2` (apply the relay log, stop replicating, `read_only=OFF`), `db1` restarted `--read-only`
as `db2`'s replica from its GTID position. No process was told: each found the new primary by
itself (the connection pool re-checks the server's role, see `jobqueue/core/db.py`).

How it is judged: `soak/checks.py` over the final tables and the execution log (one line per
handler that did its work), as for the soak; the general logs of both servers for what the
application sent them while they were read-only (`db2` before the `SET GLOBAL read_only = OFF`
of its promotion, `db1` after its restart) and their binlogs for what they wrote then (by
originating server id); the failover times from the rows' `started_at` (the database clock at
the claim; both servers share this machine's clock). A duplicate execution is a handler run
again because its first run could not finish under its lease; each is explained by its cause.

What the first runs of the drill found, both fixed (tests in
`tests/integration/test_candidate_primaries.py`):

- After the promotion, processes sat on the new primary's connections as if it were still a
  replica for up to 5 s more: a connection that had landed on the replica while no primary was
  writable kept that verdict for `PRIMARY_CHECK_SECONDS`. With 5 s leases, jobs in flight lost
  their leases and a finished handler's result write gave up (its run superseded with
  "retried: NotPrimary"); processes first claimed there 4-6 s after the promotion. Such a
  connection is now checked again after `NOT_WRITABLE_CHECK_SECONDS` (1 s): in the run above the
  first claim came {f.get("first_claim_after_writable_seconds")} s after the promotion.
- Busy workers sent their claims to the replica while no primary was writable (9 claim SELECTs in
  a 600-job run, each refused with error 1290); and, as the test for it showed, a claim that read
  the read-only flags of a demoted primary did not mark its connection, so the next claims on it
  went there too for up to 5 s. Now a claim is
  not sent on a connection whose server is known not to be writable, and a transaction that finds
  the flags on marks its connection.

Enqueue retries (same task_key): {json.dumps(n["enqueue_retries"], sort_keys=True)}. Fresh keys
acknowledged with `duplicate: true` (an earlier try had committed but its answer was lost):
{json.dumps(n["fresh_keys_acknowledged_as_duplicate"], sort_keys=True)}. Log events across all
processes: {json.dumps(n["log_events"], sort_keys=True)}.
{throughput}"""


def duplicate_runs(obs: Observed) -> list[dict]:
    """Every run of the task_keys that ran more than once, with the cause soak/checks.py gives
    the superseded ones: what the report's causes are made of."""
    by_key = {r.task_key: r for r in obs.rows}
    outcome_of = {(job_id, attempt): (outcome, error) for job_id, attempt, outcome, error in obs.attempt_rows}
    runs: dict[str, list[Execution]] = {}
    for ex in obs.executions:
        runs.setdefault(ex.task_key, []).append(ex)
    out = []
    for key, items in sorted(runs.items()):
        if len(items) < 2 or key not in by_key:
            continue
        row = by_key[key]
        out.append(
            {
                "task_key": key,
                "final": f"{row.status} at attempt {row.attempts}",
                "runs": [
                    {
                        "attempt": ex.attempt,
                        "worker": ex.worker,
                        "cause": None
                        if row.status == "done" and ex.attempt == row.attempts
                        else _cause(ex, outcome_of.get((row.id, ex.attempt)), obs),
                    }
                    for ex in items
                ],
            }
        )
    return out
