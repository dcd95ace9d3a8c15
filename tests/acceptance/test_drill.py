"""The scale-out and failover drill, scaled down to a few minutes: `python -m drill.run --quick`
(1,500 jobs over 60 s) on three application hosts and a primary + semi-sync replica of each server
flavour (--server: mariadb, mysql, mariadb11), each in a
network namespace, with SIGKILLed workers, a SIGKILLed gunicorn worker, a host cut off past its
lease, replays, and the failover (primary SIGKILLed, replica promoted, old primary back read-only).
The full drill is `python -m drill.run` (docs/scale-out.md has its last result). Needs root.

CI runs it on MariaDB 10.11 and MySQL 9.7; on MariaDB 11.8 by hand, `python -m drill.run --quick
--server mariadb11` (it passed in 125 s on 2026-12-04), to keep CI under its time budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from drill.run import FAULT_KINDS
from testkit.netns import netns_unavailable_reason
from testkit.procs import REPO, cli_env, run_report

pytestmark = [pytest.mark.slow, pytest.mark.only_servers("mariadb", "mysql")]

SEED = os.environ.get("DRILL_SEED", "20261202")


def test_quick_drill_loses_nothing_across_hosts_and_a_failover(db_server, tmp_path):
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path / "drill"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "drill.run",
            "--quick",
            "--seed",
            SEED,
            "--server",
            db_server,
            "--workdir",
            str(workdir),
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=900,
    )
    report = run_report(out, workdir, "DRILL ")
    results_file = workdir / "results.json"
    assert results_file.exists(), report
    results = json.loads(results_file.read_text())

    # What goes in comes out, once.
    assert results["acked"] == results["jobs"], report
    assert results["lost"] == 0, report
    assert results["duplicate_results"] == 0, report
    assert results["attempts_backwards"] == 0, report
    assert "no attempt record" not in results["duplicate_causes"], report
    assert {k: n for k, n in results["faults"].items() if n < 1} == {}, report
    assert set(results["faults"]) == set(FAULT_KINDS)

    # No claim ran on a read-only server: the servers' own logs say so.
    for window in results["read_only"]:
        assert window["claim_updates"] == 0 and window["writes"] == 0, report
    assert results["binlog"]["own_before_promotion"] == 0, report
    assert results["binlog"]["extra_on_old_primary"] == 0, report

    # Every process found the new primary by itself.
    failover = results["failover"]
    assert failover["first_claim_seconds"] is not None, report
    assert failover["processes_through_failover"] >= 2 * 3, report
    assert failover["processes_never_claimed_on_new_primary"] == [], report
    assert failover["processes_without_heartbeat_on_new_primary"] == [], report

    assert results["problems"] == {}, report
    assert results["passed"] and out.returncode == 0, report
    verdicts = [line for line in out.stdout.splitlines() if line.startswith("DRILL ")]
    assert verdicts == [results["verdict"]] and verdicts[0].startswith("DRILL PASS: "), report
