"""Tasks every install has: for demos, smoke tests, benchmarks and the acceptance tests."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import tempfile
import urllib.parse
from typing import Any

from .errors import LeaseLostError, PermanentError
from .settings import current
from .tasks import JobContext, task


@task("noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing; measures the queue itself."""


@task("sleep")
def sleep(payload: dict[str, Any], ctx: JobContext) -> None:
    """Sleeps `{"seconds": x}` (0..3600), like a slow export or transcode would, and stops early
    when its lease is lost (an operator failed, requeued or cancelled it, or it was reaped)."""
    seconds = payload.get("seconds", 1)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 3600:
        raise PermanentError('sleep needs {"seconds": a number in 0..3600}')
    if ctx.lease_lost.wait(seconds):
        raise LeaseLostError(f"job {ctx.job_id} attempt {ctx.attempt}: lease lost after sleeping part of {seconds} s")


@task("fail", max_attempts=3)
def fail(payload: dict[str, Any], ctx: JobContext) -> None:
    """Always raises: shows retries with backoff, then a job failed for good with its error."""
    raise RuntimeError(payload.get("message") or f"fail task always fails (attempt {ctx.attempt})")


def export_dir() -> str:
    return current().export_dir or os.path.join(os.getcwd(), "instance", "exports")


def csv_cell(value: Any) -> Any:
    """A cell that a spreadsheet will not run as a formula: text starting with =, +, -, @, a tab
    or a carriage return gets a leading apostrophe (OWASP's advice on CSV injection). Numbers
    stay numbers."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def export_path(task_key: str) -> str:
    # Quoting keeps any task_key a single, reversible file name inside the export folder.
    return os.path.join(export_dir(), urllib.parse.quote(task_key, safe="-_.") + ".csv")


@task("export_orders")
def export_orders(payload: dict[str, Any], ctx: JobContext) -> None:
    """Writes the orders in `{"orders": [{"id": .., "amount": ..}, ...]}` (or `{"rows": n}`
    generated ones) to <export dir>/<task_key>.csv and records the file as the result.

    The file appears atomically (temp file, fsync, rename) under a name derived from the
    task_key, and the result row is keyed by task_key, so replaying the same task_key leaves
    exactly one file and one result row however many times the handler ran.
    """
    orders = payload.get("orders")
    if orders is None:
        rows = payload.get("rows", 3)
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= 1_000_000:
            raise PermanentError('export_orders needs "orders": [...] or "rows": 0..1000000')
        orders = [{"id": i, "amount": f"{(i * 7919) % 10000 / 100:.2f}"} for i in range(1, rows + 1)]
    if not isinstance(orders, list) or not all(isinstance(o, dict) for o in orders):
        raise PermanentError('export_orders: "orders" must be a list of objects')

    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["order_id", "amount"])
    for n, order in enumerate(orders):
        if n % 1000 == 0 and ctx.lease_lost.is_set():
            raise LeaseLostError(f"job {ctx.job_id} attempt {ctx.attempt}: lease lost while exporting")
        writer.writerow([csv_cell(order.get("id")), csv_cell(order.get("amount"))])
    data = buf.getvalue().encode("utf-8")

    path = export_path(ctx.task_key)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".export-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # The file relative to the export folder: where the server keeps it is not the client's business.
    ctx.record_result({"file": os.path.basename(path), "rows": len(orders), "sha256": hashlib.sha256(data).hexdigest()})
