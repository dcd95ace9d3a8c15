"""The replica settings and the doctor's verdict on each watched replica, from what a server can
report (the integration test, tests/integration/test_replica_lag.py, makes each state happen on a
real replica where it can: caught up, lagging, SQL thread stopped, down)."""

from __future__ import annotations

import pytest

from jobqueue.core.doctor import Verdict, check_replica
from jobqueue.core.replica_watch import Pause, ReplicaReport
from jobqueue.core.repository.replicas import ReplicaLag
from jobqueue.core.settings import Settings, SettingsError


def report(lag: ReplicaLag | None, error: str | None = None) -> ReplicaReport:
    return ReplicaReport("db2:3306", lag, error)


@pytest.mark.parametrize(
    "lag, verdict, says",
    [
        (ReplicaLag(True, 0, "0 s behind the primary", "Yes", "Yes"), Verdict.OK, "0 s behind"),
        (ReplicaLag(True, 5, "5 s behind the primary", "Yes", "Yes"), Verdict.OK, "the bound is 5 s"),
        (ReplicaLag(True, 6, "6 s behind the primary", "Yes", "Yes"), Verdict.WARNING, "over the 5 s bound"),
        (ReplicaLag(True, None, "replication not running", "Connecting", "Yes"), Verdict.WARNING, "reconnecting"),
        (ReplicaLag(True, None, "replication not running", "Yes", "No"), Verdict.PROBLEM, "NULL"),
        (ReplicaLag(True, None, "replication not running", "No", "Yes"), Verdict.PROBLEM, "IO thread No"),
        (ReplicaLag(None, None, "lag unknown (no privilege)"), Verdict.WARNING, "lag unknown"),
        (ReplicaLag(False, None, "not a replica"), Verdict.WARNING, "replicates from nobody"),
        (None, Verdict.PROBLEM, "did not answer: refused"),
    ],
)
def test_each_state_of_a_replica_has_one_verdict(lag, verdict, says):
    check = check_replica(report(lag, "refused" if lag is None else None), limit=5)
    assert check.name == "replica db2:3306" and check.verdict is verdict and says in check.detail
    assert check.advice or verdict is Verdict.OK


def test_only_a_known_lag_over_the_bound_holds_a_bulk():
    behind = report(ReplicaLag(True, 9, "9 s behind the primary", "Yes", "Yes"))
    stopped = report(ReplicaLag(True, None, "replication not running (IO Yes, SQL No)", "Yes", "No"))
    down = report(None, "refused")
    assert behind.over(5) and not stopped.over(5) and not down.over(5)
    assert stopped.unread and down.unread and not behind.unread
    assert not report(ReplicaLag(False, None, "not a replica")).unread  # nothing to wait for there
    holding = Pause(1.0, 5, (behind,), (down,), (behind,))
    assert holding.holding and holding.note == (
        "replica db2:3306 is 9 s behind, over the 5 s bound; replica "
        "db2:3306 could not be read (did not answer: refused), so nothing "
        "waits for it"
    )
    assert Pause(0.0, 5, (), (), ()).note is None


def test_replica_settings():
    settings = Settings.from_env({"JOBQUEUE_REPLICA_URLS": " mysql://u:p@db2/jq  mariadb+pymysql://u@db3 "})
    assert settings.replica_urls == ("mysql://u:p@db2/jq", "mariadb+pymysql://u@db3")
    assert settings.replica_lag_limit == 5 and Settings.from_env({}).replica_urls == ()
    with pytest.raises(SettingsError, match="JOBQUEUE_REPLICA_URLS takes MySQL/MariaDB") as refused:
        Settings.from_env({"JOBQUEUE_REPLICA_URLS": "mysql://u:p@db2 postgresql://u:secret@db3"})
    assert "secret" not in str(refused.value)
    for bad in ("0", "3601", "2.5", "x"):
        with pytest.raises(SettingsError, match="JOBQUEUE_REPLICA_LAG_LIMIT"):
            Settings.from_env({"JOBQUEUE_REPLICA_LAG_LIMIT": bad})
