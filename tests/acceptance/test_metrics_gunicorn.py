"""/metrics scraped from a real gunicorn with 2 worker processes: counters from both processes
add up (prometheus_client multiprocess mode), and the queue gauges come from the database."""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request

import pytest

from jobqueue.core import repository
from jobqueue.core.db import create_engine
from testkit.procs import GunicornServer, wait_until
from testkit.web import VIEWER_TOKEN, api_post, server_env

pytestmark = pytest.mark.slow


def scrape(base: str, token: str | None = VIEWER_TOKEN) -> str:
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def value(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? ([0-9.e+-]+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_metrics_from_two_gunicorn_workers(mysql_url, tmp_path):
    engine = create_engine(mysql_url)
    server = GunicornServer(mysql_url, tmp_path, web_workers=2, embedded_workers=2, extra_env=server_env(mysql_url))
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(server.base, token=None)
        assert refused.value.code == 401
        refused.value.close()
        # Jobs slow enough that the process taking the API calls cannot run them all alone.
        for i in range(60):
            api_post(server.base, "/api/jobs", {"task": "slow_noop", "task_key": f"m-{i}", "payload": {"seconds": 0.2}})
        with engine.connect() as conn:
            wait_until(
                lambda: repository.stats.count_by_status(conn) == [("default", "done", 60)],
                timeout=60,
                message="60 jobs done",
            )
        text = scrape(server.base)
        with engine.connect() as conn:
            owners = {j.lease_owner.split(":")[1] for j in repository.reads.list_jobs(conn, limit=100)}
    finally:
        assert server.stop() == 0
        engine.dispose()
    assert len(owners) == 2, "both processes completed jobs"
    assert value(text, "jobqueue_jobs_completed_total", queue="default") == 60
    assert value(text, "jobqueue_jobs_claimed_total", queue="default") == 60
    assert value(text, "jobqueue_jobs_enqueued_total", queue="default") == 60
    assert value(text, "jobqueue_claims_total") >= 2
    assert value(text, "jobqueue_queue_jobs", queue="default", status="done") == 60
    assert value(text, "jobqueue_queue_jobs", queue="default", status="ready") == 0
    assert "jobqueue_empty_claims_total" in text and "jobqueue_queue_oldest_ready_age_seconds" in text
    # Histograms, summed over both processes: every attempt's run time, every job's wait from
    # run_at to its claim, every claim transaction.
    assert value(text, "jobqueue_attempt_duration_seconds_count", task="slow_noop", outcome="done") == 60
    assert value(text, "jobqueue_attempt_duration_seconds_bucket", task="slow_noop", outcome="done", le="0.1") == 0
    assert value(text, "jobqueue_attempt_duration_seconds_bucket", task="slow_noop", outcome="done", le="0.5") == 60
    assert 60 * 0.2 <= value(text, "jobqueue_attempt_duration_seconds_sum", task="slow_noop") < 60 * 0.5
    assert value(text, "jobqueue_start_delay_seconds_count", queue="default") == 60
    assert value(text, "jobqueue_claim_duration_seconds_count") >= value(text, "jobqueue_claims_total") / 2
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip(), f"promtool: {lint.stdout}{lint.stderr}"
