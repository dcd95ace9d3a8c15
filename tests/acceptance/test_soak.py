"""The fault-injection soak, scaled down to about a minute: `python -m soak.run --quick` against
its own throwaway server of each flavour (--server: mariadb, mysql, mariadb11), with every kind of fault at least once (SIGKILLed, SIGTERMed and
SIGSTOPped workers, a SIGKILLed gunicorn worker, killed connections, a database restart, held
rows, replayed task_keys, an operator taking back a prefetched job, a pause while claims stall in
their transaction), with chains, fan-ins and batches among the jobs. What goes in must come out:
nothing acknowledged is lost, no task_key gets two results, no handler starts after its job was
taken back, no claim commits in a pause, no dependent job is claimed before its parents have
finished, every batch finishes with each callback its outcome calls for enqueued exactly once. The full soak is `python -m soak.run` (docs/soak.md has its last result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from soak.run import FAULT_KINDS
from testkit.procs import REPO, cli_env, run_report

pytestmark = pytest.mark.slow

SEED = os.environ.get("SOAK_SEED", "20261130")


def test_quick_soak_loses_nothing_under_faults(db_server, tmp_path):
    workdir = tmp_path / "soak"
    out = subprocess.run(
        [sys.executable, "-m", "soak.run", "--quick", "--seed", SEED, "--server", db_server, "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=300,
    )
    report = run_report(out, workdir, "SOAK ")
    results_file = workdir / "results.json"
    assert results_file.exists(), report
    results = json.loads(results_file.read_text())

    assert results["lost"] == 0, report
    assert results["duplicate_results"] == 0, report
    assert results["attempts_backwards"] == 0, report
    assert {k: n for k, n in results["faults"].items() if n < 1} == {}, report
    assert set(results["faults"]) == set(FAULT_KINDS)
    assert results["acked"] == results["jobs"], report
    assert results["claims_while_paused"] == 0, report
    assert results["workflow_jobs"] > 0 and results["dependent_jobs"] > 0, report
    assert results["started_before_parents"] == 0 and results["ran_despite_failed_parent"] == 0, report
    assert results["batches"] > 0 and results["batches_not_finished"] == 0, report
    assert results["callbacks_complete"] == results["batches"], report  # every batch completes
    assert results["duplicate_callbacks"] == 0 and results["callbacks_missing"] == 0, report
    assert results["callbacks_unexpected"] == 0 and results["batch_counts_wrong"] == 0, report
    assert results["details"]["take_back_done"] >= 1 and results["details"]["started_after_take_back"] == [], report
    assert results["problems"] == {}, report
    assert results["passed"] and out.returncode == 0, report
    verdicts = [line for line in out.stdout.splitlines() if line.startswith("SOAK ")]
    assert verdicts == [results["verdict"]] and verdicts[0].startswith("SOAK PASS: "), report
