"""The soak's verdict: the figures and problems of a run (results.json), its table, and the
markdown report (docs/soak.md)."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime

from soak.checks import Observed, check
from soak.plan import LEASE_SECONDS, PAUSE_NOTICE_SECONDS, Plan
from testkit.faults import Outcome
from testkit.throwaway import describe_flavour


def judge(
    soak,
    schedule: list[tuple[float, str]],
    obs: Observed,
    twin_check: dict,
    drained: bool,
    codes: dict[str, int | None],
    times: dict[str, float],
) -> Outcome:
    """The verdict, its figures and the problems found; results.json and faults.log in the workdir."""
    plan, seed = soak.plan, soak.seed
    fault_start, fault_end = times["fault_start"], times["fault_end"]
    terminal_at_fault_start, terminal_at_fault_end = times["terminal_at_fault_start"], times["terminal_at_fault_end"]
    findings = check(obs)
    finished = sum(1 for r in obs.rows if r.status in ("done", "failed"))
    wall = times["drain_end"] - soak.t0
    numbers = {
        "seed": seed,
        "jobs": len(soak.specs),
        "workflow_jobs": sum(1 for s in soak.specs.values() if s.after or s.batch),
        **soak.common_numbers(findings, times["load_before"]),
        "connections_killed": soak.faults.get("connections_killed", 0),
        "restart_outage_seconds": round(soak.restart_outage, 2),
        "db_crash": plan.crash_db,
        "server": plan.server,
        "terminal_regressions": findings.get("terminal_regressions"),
        "cancelled": findings.get("cancelled"),
        "cancel_answers": dict(soak.cancel_answers),
        "cancelled_answer_lost": findings.get("cancelled_answer_lost"),
        "pause_windows_seconds": [round(end - start + PAUSE_NOTICE_SECONDS, 1) for start, end in soak.pause_windows],
        "claims_while_paused": findings.get("claims_while_paused"),
        "results_of_reaped_attempts": findings.get("results_of_reaped_attempts"),
        "max_attempts_raised": findings.get("max_attempts_raised"),
        "fenced_late_writes": soak.fenced_late_writes(),
        **{
            name: findings.get(name)
            for name in (
                "dependent_jobs",
                "cancelled_by_parent",
                "started_before_parents",
                "ran_despite_failed_parent",
                "children_not_settled",
                "batches",
                "batches_not_finished",
                "batch_counts_wrong",
                "callbacks",
                "callbacks_success",
                "callbacks_failure",
                "callbacks_complete",
                "callback_executions",
                "callbacks_missing",
                "callbacks_unexpected",
                "duplicate_callbacks",
            )
        },
        "duration_seconds": round(wall, 1),
        "fault_window_seconds": round(fault_end - fault_start, 1),
        "enqueue_seconds": round(getattr(soak, "enqueue_seconds", float("nan")), 1),
        "throughput_under_faults": round(
            (terminal_at_fault_end - terminal_at_fault_start) / max(1e-9, fault_end - fault_start), 1
        ),
        "throughput_overall": round(finished / max(1e-9, wall), 1),
        "exit_codes": codes,
        "log_events": dict(soak.log_counts()),
    }
    numbers["two_primaries"] = twin_check["numbers"]
    problems, bad_codes, missing = soak.common_problems(findings, drained, codes, schedule)
    problems.update(twin_check["problems"])
    unclosed = sorted(k for k in soak.batches_opened if not soak.batches_closed.get(k))
    for name, items in (
        ("batches_not_closed", unclosed),
        ("held_rows_touched", soak.held_touched),
        ("actions_gave_up", soak.actions_gave_up),
        ("started_after_take_back", soak.take_back_late),
    ):
        if items:
            problems[name] = len(items)
    if soak.take_back_rounds and not soak.take_back_done:
        problems["take_back_never_done"] = len(soak.take_back_rounds)
    numbers["problems"] = problems
    numbers["details"] = {
        "enqueue_gave_up": soak.enqueue_gave_up[:10],
        "enqueue_rejected": soak.enqueue_rejected[:10],
        "replay_mismatches": soak.replay_mismatches[:10],
        "held_rows_touched": soak.held_touched[:10],
        "actions_gave_up": soak.actions_gave_up[:10],
        "take_back_rounds": soak.take_back_rounds,
        "take_back_done": soak.take_back_done,
        "started_after_take_back": soak.take_back_late,
        "batches_not_closed": unclosed[:10],
        "unexpected_exits": soak.unexpected_exits,
        "nonzero_exit_codes": bad_codes,
        "faults_not_injected": missing,
    }
    return soak.conclude(
        "SOAK",
        f"{numbers['jobs']} jobs ({numbers['workflow_jobs']} in workflows), {sum(numbers['faults'].values())} "
        f"faults, {numbers['lost']} lost, {numbers['duplicate_results']} duplicate results, "
        f"{numbers['duplicate_executions']} duplicate executions, {numbers['started_before_parents']} started "
        f"before a parent finished, {numbers['duplicate_callbacks']} duplicate callbacks, "
        f"{numbers['throughput_under_faults']} jobs/s under faults",
        problems,
        numbers,
        table,
    )


def by_kind(n: dict) -> str:
    return ", ".join(
        f"{k} {sum(v.values())} ({'/'.join(f'{s} {c}' for s, c in sorted(v.items()))})" for k, v in n["by_kind"].items()
    )


def listed(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def outcome_rows(n: dict) -> list[tuple[str, str]]:
    """The rows of the checks' verdict (soak/checks.py), the same in the soak's and the drill's tables."""
    causes = "; ".join(f"{k}: {v}" for k, v in n["duplicate_causes"].items()) or "none"
    return [
        ("**lost** (must be 0)", str(n["lost"])),
        ("**duplicate results** (must be 0)", str(n["duplicate_results"])),
        (
            "duplicate executions",
            f"{n['duplicate_executions']} task_keys ({n['extra_executions']} extra runs of "
            f"{n['executions']}); superseded runs by cause: {causes}",
        ),
    ]


def workflow_rows(n: dict) -> list[tuple[str, str]]:
    return [
        (
            "**dependent jobs first claimed before a parent finished** (must be 0)",
            f"{n['started_before_parents']} of {n['dependent_jobs']} dependent jobs "
            f"({n['cancelled_by_parent']} cancelled by a failed or cancelled parent; not cancelled though "
            f"a parent failed: {n['ran_despite_failed_parent']}; finished before a parent: {n['children_not_settled']})",
        ),
        (
            "**batch callbacks enqueued twice** (must be 0)",
            f"{n['duplicate_callbacks']}; {n['batches']} batches ({n['batches_not_finished']} not finished, "
            f"{n['batch_counts_wrong']} with wrong counts), callbacks {n['callbacks']} (on_success "
            f"{n['callbacks_success']}, on_failure {n['callbacks_failure']}, on_complete {n['callbacks_complete']}; "
            f"missing {n['callbacks_missing']}, unexpected {n['callbacks_unexpected']}), "
            f"{n['callback_executions']} callback runs",
        ),
    ]


def monitor_rows(n: dict) -> list[tuple[str, str]]:
    return [
        ("attempts went backwards (must be 0)", f"{n['attempts_backwards']} in {n['monitor_samples']} samples"),
        ("other invariants (must be 0)", ", ".join(f"{k} {v}" for k, v in n["violations"].items()) or "all 0"),
    ]


def failed_not_doomed(n: dict) -> str:
    return f"{n['failed_not_doomed']}" + (
        f" ({'; '.join(f'{k[:60]}: {v}' for k, v in n['unexpected_failure_reasons'].items())})"
        if n["unexpected_failure_reasons"]
        else ""
    )


def markdown_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(r[0]) for r in rows)
    return "\n".join(
        [f"| {'measure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
        + [f"| {a:<{width}} | {b} |" for a, b in rows]
    )


def table(n: dict) -> str:
    rows = [
        (
            "jobs enqueued",
            f"{n['jobs']} ({n['jobs_api']} via HTTP API, {n['jobs_cli']} via CLI), {n['acked']} acknowledged",
        ),
        ("jobs by kind (final status)", by_kind(n)),
        (
            "faults injected",
            f"{listed(n['faults'])}; {n['connections_killed']} connections killed, "
            f"{n['replayed_keys']} task_keys replayed, database {'crash' if n['db_crash'] else 'restart'} "
            f"outage {n['restart_outage_seconds']} s",
        ),
        *outcome_rows(n),
        *workflow_rows(n),
        ("late writes refused by the fence (stopped workers)", str(n["fenced_late_writes"])),
        (
            "pauses (claims while paused, must be 0)",
            f"{len(n['pause_windows_seconds'])} pauses of "
            f"{'/'.join(f'{s:g}' for s in n['pause_windows_seconds'])} s; "
            f"{n['claims_while_paused']} claims",
        ),
        (
            "cancellations",
            f"{n['cancelled']} jobs cancelled ({n['cancelled_answer_lost']} by a cancel whose answer was lost); "
            f"answers {json.dumps(n['cancel_answers'], sort_keys=True)}",
        ),
        *monitor_rows(n),
        (
            "failed but not doomed",
            failed_not_doomed(n)
            + (
                f"; {n['results_of_reaped_attempts']} of them with a result recorded by an attempt "
                "then taken back (lease ran out, or a forced requeue)"
                if n.get("results_of_reaped_attempts")
                else ""
            ),
        ),
        (
            "throughput",
            f"{n['throughput_under_faults']} jobs/s under faults ({n['fault_window_seconds']} s window), "
            f"{n['throughput_overall']} jobs/s overall",
        ),
        ("duration", f"{n['duration_seconds']} s (enqueue {n['enqueue_seconds']} s)"),
        ("exit codes after SIGTERM", listed(n["exit_codes"])),
        (
            "problems",
            ", ".join(
                f"{k}={v}"
                + (
                    f" ({'; '.join(map(str, n['details'][k][:3]))})"
                    if isinstance(n["details"].get(k), list) and n["details"][k]
                    else ""
                )
                for k, v in n["problems"].items()
            )
            or "none",
        ),
    ]
    return markdown_table(rows)


def markdown(outcome: Outcome, command: str, plan: Plan) -> str:
    n = outcome.numbers
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""# Soak: last result

`{command}` on {when} ({platform.machine()}, {os.cpu_count()} cores shared with other work: load
average {n["load_average_1min"][0]} at the start, {n["load_average_1min"][1]} at the end; Python
{platform.python_version()}, {describe_flavour(plan.server)}), seed {n["seed"]}.

**{outcome.verdict}**

{outcome.table}

Set-up: a throwaway server ({plan.server}); {plan.workers} `jobqueue worker --concurrency {plan.concurrency}
--lease-seconds {LEASE_SECONDS}` processes and gunicorn with {plan.web_workers} web processes of
{plan.embedded_workers} embedded workers each; faults for {plan.fault_seconds:g} s on a seeded
schedule, then a drain. See docs/soak-and-drill.md for what each check means.

Enqueue retries (same task_key): {json.dumps(n["enqueue_retries"], sort_keys=True)}. Fresh keys
acknowledged with `duplicate: true` because an earlier try had committed but its answer was lost
(the job exists once either way): {json.dumps(n["fresh_keys_acknowledged_as_duplicate"], sort_keys=True)}.
Log events across all processes:
{json.dumps(n["log_events"], sort_keys=True)}. Exit codes: {json.dumps(n["exit_codes"], sort_keys=True)}.
Faults that could not be injected when due: {len(n["fault_errors"])}{(": " + "; ".join(n["fault_errors"][:5])) if n["fault_errors"] else ""}.
"""
