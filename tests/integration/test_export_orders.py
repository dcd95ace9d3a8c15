"""The built-in export (issue 12, item 8): cells a spreadsheet would run as formulas are
escaped, and the recorded result names the file relative to the export folder."""

from __future__ import annotations

import csv
import json

from jobqueue.core import repository
from testkit.procs import cli_env, jobqueue

HOSTILE = ['=HYPERLINK("https://evil.example","x")', "+1+1", "-2-2", "@SUM(A1)", "\tTAB", "\rCR", "fine", "a=b"]


def test_formula_cells_are_escaped_and_the_result_has_no_server_path(mysql_url, mysql_engine, tmp_path):
    export_dir = tmp_path / "exports"
    env = cli_env(JOBQUEUE_EXPORT_DIR=str(export_dir))
    orders = [{"id": value, "amount": value} for value in HOSTILE] + [{"id": 7, "amount": -3.5}]
    enqueued = jobqueue(
        mysql_url,
        "enqueue",
        "export_orders",
        "--key",
        "orders/2026 11",
        "--payload",
        json.dumps({"orders": orders}),
        env=env,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    burst = jobqueue(mysql_url, "worker", "--burst", env=env)
    assert burst.returncode == 0, burst.stderr

    (path,) = export_dir.iterdir()
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["order_id", "amount"]
    cells = [row[0] for row in rows[1:-1]]
    assert cells == ["'" + v if v[0] in "=+-@\t\r" else v for v in HOSTILE]
    assert rows[-1] == ["7", "-3.5"]  # numbers stay numbers
    with mysql_engine.connect() as conn:
        result = repository.reads.get_result(conn, "orders/2026 11")["result"]
    assert result["file"] == path.name == "orders%2F2026%2011.csv"
    assert str(tmp_path) not in json.dumps(result) and result["rows"] == len(orders)
