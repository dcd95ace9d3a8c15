"""OpenTelemetry's SDK in a process of its own, for tests/integration/test_otel.py: every span
this process ends is appended as one JSON line to the file named by JQ_OTEL_SPANS.

- As a worker's task module (`jobqueue worker --tasks testkit.otel`): the SDK is set up at
  import, and the tasks below register.
- As the enqueuing process (`python -m testkit.otel URL ACTIONS_JSON`): each action runs inside
  a span of its own, `test <do>`, whose ids are in the spans file like any other.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from jobqueue.core.tasks import task

_lock = threading.Lock()
_reader = InMemoryMetricReader()


class JsonLines(SpanExporter):
    def __init__(self, path: str):
        self.path = path

    def export(self, spans) -> SpanExportResult:
        lines = [json.dumps(as_dict(span)) + "\n" for span in spans]
        with _lock, open(self.path, "a") as f:
            f.writelines(lines)
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict:
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "links": [
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x")}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [e.name for e in span.events],
    }


def read_spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def setup() -> None:
    path = os.environ.get("JQ_OTEL_SPANS")
    if not path:
        return
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(path)))
    trace.set_tracer_provider(provider)
    from opentelemetry import metrics

    metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))


setup()


# --- the tasks the worker runs ------------------------------------------------------------------


@task("otel_ok", max_attempts=1)
def otel_ok(payload, ctx):
    """Opens a span of its own: a child of the attempt's."""
    with trace.get_tracer("testkit").start_as_current_span("inside"):
        pass


@task("otel_flaky", max_attempts=3, retry_base_seconds=0.05)
def otel_flaky(payload, ctx):
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails on purpose")


@task("otel_slow", max_attempts=1, timeout_seconds=0.5)
def otel_slow(payload, ctx):
    ctx.lease_lost.wait(5)  # past its timeout: the attempt fails as `timeout` while this still runs


@task("otel_async", max_attempts=1)
async def otel_async(payload, ctx):
    with trace.get_tracer("testkit").start_as_current_span("inside"):
        pass


@task("otel_metrics", max_attempts=1)
def otel_metrics(payload, ctx):
    """Writes the histograms this process has recorded so far to payload["path"]."""
    data = _reader.get_metrics_data()
    names = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                names[metric.name] = sum(point.count for point in metric.data.data_points)
    Path(payload["path"]).write_text(json.dumps(names))


# --- the enqueuing process ----------------------------------------------------------------------


def _run(url: str, actions: list[dict]) -> None:
    from jobqueue import JobQueue
    from jobqueue.core import repository, service

    tracer = trace.get_tracer("test")
    with JobQueue(url) as jq:
        for action in actions:
            with tracer.start_as_current_span(f"test {action['do']}"):
                if action["do"] == "enqueue":
                    jq.enqueue(action["task"], action["key"], action.get("payload"), allow_unregistered=True)
                elif action["do"] == "batch":
                    jq.batch(action["key"], on_complete=action["on_complete"])  # members: in spans of their own
                elif action["do"] == "member":
                    jq.enqueue(action["task"], action["key"], batch=action["batch"], allow_unregistered=True)
                elif action["do"] == "close":
                    jq.close_batch(action["batch"])
                elif action["do"] == "recurring":
                    with jq.engine.connect() as conn:
                        service.upsert_recurring(
                            conn, action["name"], cron="* * * * *", task=action["task"], actor="test"
                        )
                        row = service.enqueue_due_recurring(
                            conn, now=repository.reads.database_now(conn) + timedelta(minutes=2)
                        )
                        assert row.enqueued == 1, row


if __name__ == "__main__":
    _run(sys.argv[1], json.loads(sys.argv[2]))
