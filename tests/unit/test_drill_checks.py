"""The drill's read-only checks (drill/readonly.py) on made-up general-log entries and binlog
origins: what counts as a claim or a write sent to a read-only server, and what a transaction
written there looks like in the binlogs."""

from __future__ import annotations

from drill.readonly import compare_origins, window_of
from testkit.replication import LoggedCommand

CLAIM = (
    "SELECT job_queue.id, job_queue.task_key, @@global.read_only FROM job_queue FORCE INDEX (ix_ready_pick) "
    "WHERE job_queue.status = 'ready' AND job_queue.queue = 'default' ORDER BY job_queue.priority, job_queue.id "
    "LIMIT 4 FOR UPDATE SKIP LOCKED"
)
TAKE = "UPDATE job_queue SET status='running', lease_owner=CASE job_queue.id WHEN 7 THEN 'h:1:1' END WHERE id IN (7)"


def entry(argument: str, user: str | None = "jq_app@10.0.0.4", command: str = "Query") -> LoggedCommand:
    return LoggedCommand(0, 1, command, argument, user)


def test_claims_and_writes_from_the_application_are_counted_and_the_rest_is_not():
    entries = [
        entry(CLAIM),
        entry(CLAIM, command="Execute"),
        entry(TAKE),
        entry("SELECT 1"),
        entry("INSERT INTO job_result VALUES (1)"),
        entry(TAKE, user="root@10.0.0.1"),  # the drill's own statements
        entry(TAKE, user=None),  # the replica's SQL thread applying the primary's
        entry("jq_app@10.0.0.4 on drill", command="Connect"),
    ]
    window = window_of(entries, "db2", "jq_app")
    assert (window.statements, window.claims, window.claim_updates, window.writes) == (5, 2, 1, 2)
    assert window.examples[0].startswith("UPDATE job_queue")


def test_a_transaction_written_on_the_replica_or_the_demoted_primary_shows_by_its_origin():
    # db1 (1) wrote 3, db2 replicated them and, promoted, wrote 2 that db1 replicated back.
    clean = compare_origins(old_ids=[1, 1, 1, 2, 2], new_ids=[1, 1, 1, 2, 2])
    assert clean.clean and clean.gtids == {"db1": {1: 3, 2: 2}, "db2": {1: 3, 2: 2}}
    # db2 wrote one of its own while it still replicated db1.
    errant = compare_origins(old_ids=[1, 1, 2, 1, 2], new_ids=[1, 2, 1, 1, 2])
    assert errant.own_before_promotion == 1 and not errant.clean
    # db1 wrote after its demotion (or holds one db2 never received).
    extra = compare_origins(old_ids=[1, 1, 1, 2, 1], new_ids=[1, 1, 1, 2])
    assert extra.extra_on_old_primary == 1 and not extra.clean
