"""croniter's `R` (a random tick) and `H` (a hashed one) are refused wherever a schedule comes
in: each process evaluating `R * * * *` picks a tick of its own, so 6 processes made 5 jobs for an
hourly schedule (issue 25, defect 5). The CLI, the HTTP API and @task(cron=...) all say so."""

from __future__ import annotations

import pytest

from jobqueue.core.errors import ValidationError
from jobqueue.core.recurring import parse_cron
from jobqueue.core.tasks import Registry, task
from testkit.procs import jobqueue as jobqueue_cli
from testkit.web import api

RANDOM = [
    "R * * * *",
    "0 R * * *",
    "r 3 * * *",
    "0 0 * * R",
    "R(0-29) * * * *",
    "5,R * * * *",
    "H * * * *",
    "H(0-29)/10 * * * *",
    "0 H * * *",
]


@pytest.mark.parametrize("expr", RANDOM)
def test_a_random_or_hashed_field_is_refused(expr):
    with pytest.raises(ValidationError, match="differs from process to process") as caught:
        parse_cron(expr)
    assert caught.value.field == "cron"


def test_names_with_those_letters_are_still_fine():
    assert parse_cron("0 9 * MAR THU") == "0 9 * MAR THU"
    assert parse_cron("0 9 * * FRI-SAT") == "0 9 * * FRI-SAT"


def test_at_task_refuses_it_at_import():
    with pytest.raises(ValidationError, match="'R'"):
        task("nightly_report", cron="0 R * * *", registry=Registry())(lambda payload, ctx: None)


def test_the_api_refuses_it(client):
    r = api(client, "POST", "/api/recurring", json={"name": "hourly", "cron": "R * * * *", "task": "noop"})
    assert r.status_code == 422 and r.get_json()["field"] == "cron"
    assert "differs from process to process" in r.get_json()["error"]
    assert api(client, "GET", "/api/recurring").get_json()["recurring"] == []


def test_the_cli_refuses_it(mysql_url):
    out = jobqueue_cli(mysql_url, "recurring", "add", "hourly", "--cron", "R * * * *", "--task", "noop")
    assert out.returncode == 2, out.stderr
    assert "differs from process to process" in out.stderr
    listed = jobqueue_cli(mysql_url, "recurring", "list", "--json")
    assert '"recurring": []' in listed.stdout
