"""What the dashboard bench works on: the table (a week of history over 5 queues and the live jobs of
the last hour above it, filled from a table of numbers of its own: MariaDB's seq_1_to_N tables do
not exist on MySQL), the account, and a signed-in HTTP client."""

from __future__ import annotations

import http.cookiejar
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from testkit.sql import seq_rows

PASSWORD = "bench-password-1"
TOKEN = "bench-token-0123456789abcdef"
TARGET_P95_MS = 150.0
COMMON, RARE, ERROR_TERM = "cust-42", "needle-77", "said 503"


# The shape of issue 17: a week of history (done, 1 in 19 failed) over 5 queues, then the live
# jobs of the last hour above it (40,000 ready, 9,000 scheduled, 1,000 running). `rows` grows the
# history only: a backlog does not grow with the age of an install.
QUEUES = ("default", "mail", "exports", "reports", "webhooks")
TASKS = ("noop", "send_email", "export_orders", "render_report", "deliver_webhook")
LIVE = {"ready": 40_000, "scheduled": 9_000, "running": 1_000}
DAYS = 7


def _pick(options, expr):
    return "ELT(1 + MOD(" + expr + ", 5), " + ", ".join(f"'{o}'" for o in options) + ")"


def load(url: str, rows: int, chunk: int = 250_000, live: int = sum(LIVE.values())) -> float:
    """Fill job_queue with `rows` rows of the issue's shape (and the dashboard's side tables) by
    INSERT ... SELECT over a table of the numbers 1..chunk (MariaDB's seq_1_to_N tables do not
    exist on MySQL), a commit per chunk; returns seconds. On MySQL the load is not written to the
    binary log (this session's sql_log_bin): its rows change nothing the pages read, and a 5M-row
    load would leave gigabytes of binlog on the shared server. The worker's commits are logged.
    `live`: the last hour's jobs above the history, 1 in 50 running, 9 scheduled, 40 ready."""
    engine = sa.create_engine(url, poolclass=NullPool)
    history = max(rows - live, 0)
    chunk = max(min(chunk, max(history, live)), 5000)  # 5,000 audit entries
    t0 = time.perf_counter()
    with engine.connect() as conn:
        if not getattr(conn.dialect, "is_mariadb", False):
            conn.exec_driver_sql("SET SESSION sql_log_bin = 0")
        conn.exec_driver_sql("SET SESSION unique_checks = 0")
        conn.exec_driver_sql("CREATE TABLE bench_seq (seq INT UNSIGNED NOT NULL PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO bench_seq (seq) SELECT seq FROM " + seq_rows(chunk))
        conn.commit()

        def numbers(lo: int, hi: int) -> str:
            """seq from lo to hi (hi - lo < chunk), in order: AUTO_INCREMENT ids follow seq."""
            return f"(SELECT seq + {lo - 1} AS seq FROM bench_seq WHERE seq <= {hi - lo + 1})"

        now = conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar()
        base = now - timedelta(days=DAYS, hours=1)
        span_us = DAYS * 86400 * 1_000_000
        for lo in range(1, history + 1, chunk):
            hi = min(history, lo + chunk - 1)
            conn.exec_driver_sql(
                "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, lease_owner, "
                "attempts, max_attempts, started_at, last_error, created_at, updated_at, finished_at) "
                f"SELECT CONCAT({_pick(TASKS, 'seq')}, ':', DATE_FORMAT(t, '%%Y-%%m-%%dT%%H:%%i'), ':', seq), "
                f"{_pick(TASKS, 'seq')}, {_pick(QUEUES, 'seq')}, 0, "
                'CONCAT(\'{"order": \', seq, \', "customer": "cust-\', MOD(seq, 5000), \'", "note": "\', '
                "IF(MOD(seq, 100000) = 77, CONCAT('needle-', seq), 'ok'), '\"}'), "
                "IF(MOD(seq, 19) = 0, 'failed', 'done'), t, CONCAT('host-a:100:', MOD(seq, 8)), "
                "IF(MOD(seq, 19) = 0, 5, 1), 5, t, "
                "IF(MOD(seq, 19) = 0, IF(MOD(seq, 3) = 0, 'RuntimeError: upstream said 503', "
                "'TimeoutError: smtp did not answer'), NULL), "
                "t, t + INTERVAL 200000 MICROSECOND, t + INTERVAL 200000 MICROSECOND "
                f"FROM (SELECT seq, %s + INTERVAL FLOOR((seq - 1) * {span_us} / {max(history, 1)}) MICROSECOND AS t "
                f"FROM {numbers(lo, hi)} n) s ORDER BY seq",
                (base,),
            )
            conn.commit()
        # The live jobs: the last hour, above every finished one.
        for lo in range(1, live + 1, chunk):
            hi = min(live, lo + chunk - 1)
            conn.exec_driver_sql(
                "INSERT INTO job_queue (task_key, task_name, queue, priority, payload, status, run_at, lease_owner, "
                "lease_until, attempts, max_attempts, started_at, created_at, updated_at) "
                f"SELECT CONCAT({_pick(TASKS, 'seq DIV 7')}, ':', DATE_FORMAT(t, '%%Y-%%m-%%dT%%H:%%i'), ':live-', seq), "
                f"{_pick(TASKS, 'seq DIV 7')}, {_pick(QUEUES, 'seq DIV 7')}, 0, "
                "CONCAT('{\"order\": ', seq, '}'), st, "
                "IF(st = 'scheduled', %s + INTERVAL MOD(seq, 86400) SECOND, t), "
                "IF(st = 'running', CONCAT('host-b:200:', MOD(seq, 16)), NULL), "
                "IF(st = 'running', %s + INTERVAL 1 DAY, NULL), IF(st = 'running', 1, 0), 5, "
                "IF(st = 'running', t, NULL), t, t "
                "FROM (SELECT seq, %s - INTERVAL 1 HOUR + INTERVAL FLOOR(seq * 3600000000 / "
                f"{live}) MICROSECOND AS t, "
                "IF(MOD(seq, 50) = 0, 'running', IF(MOD(seq, 50) < 10, 'scheduled', 'ready')) AS st "
                f"FROM {numbers(lo, hi)} n) s ORDER BY seq",
                (now, now, now),
            )
            conn.commit()
        conn.exec_driver_sql(
            "INSERT INTO audit_log (at, actor, action, job_id, before_status, after_status, count) "
            "SELECT UTC_TIMESTAMP(6) - INTERVAL seq MINUTE, 'web:alice', 'requeue', seq, 'failed', 'ready', 1 "
            "FROM bench_seq WHERE seq <= 5000"
        )
        for p in range(4):
            conn.exec_driver_sql(
                "INSERT INTO worker_process (id, host, pid, kind, concurrency, queues, started_at, last_heartbeat, "
                f"jobs_in_hand, processed) VALUES ('host-{p}:{100 + p}', 'host-{p}', {100 + p}, 'worker', 8, '*', "
                "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 2, 250000)"
            )
            conn.exec_driver_sql(
                "INSERT INTO worker_stats (minute, process_id, completed, failed, claims, claimed) "
                "SELECT DATE_FORMAT(UTC_TIMESTAMP() - INTERVAL (seq - 1) MINUTE, '%%Y-%%m-%%d %%H:%%i:00'), "
                f"'host-{p}:{100 + p}', 3000, 12, 800, 3000 FROM bench_seq WHERE seq <= 15"
            )
        conn.exec_driver_sql("DROP TABLE bench_seq")
        conn.commit()
        conn.exec_driver_sql("ANALYZE TABLE job_queue")
    engine.dispose()
    return time.perf_counter() - t0


class Client:
    """A signed-in browser, minus the browser."""

    def __init__(self, base: str):
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {TOKEN}"} if path.startswith("/api/") else {}
        with self.opener.open(urllib.request.Request(self.base + path, headers=headers), timeout=30) as r:
            return r.status, r.read().decode()

    def login(self) -> None:
        _, page = self.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode({"username": "bench", "password": PASSWORD, "csrf_token": token}).encode()
        with self.opener.open(self.base + "/login", data=data, timeout=30) as r:
            assert r.status == 200 and "/login" not in r.url, "login failed"
