"""The trace context a job stores (jobqueue/core/tracing.py): W3C traceparent, tracestate when
the two fit the column, the `link ` mark, and the attempt span made from each. In a fresh
interpreter, since a process sets its tracer provider once and the other tests run untraced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from jobqueue.core import tracing
from jobqueue.core.models import Job, Lease, Status

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
assert tracing.current() is None and not tracing.enabled()  # no provider yet: off
trace.set_tracer_provider(provider)
assert tracing.enabled() and tracing.current() is None  # on, but no current span

def outer(state):
    ctx = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    return trace.use_span(NonRecordingSpan(ctx))

with outer(TraceState([("vendor", "v1")])):
    stored = tracing.current()
assert stored == "00-00000000000000000000000000001234-0000000000005678-01 vendor=v1", stored
with outer(TraceState([("k" + str(i), "x" * 200) for i in range(2)])):
    assert tracing.current() == "00-00000000000000000000000000001234-0000000000005678-01"  # too long: no state
assert tracing.link(stored) == "link " + stored and tracing.link(tracing.link(stored)) == "link " + stored
assert tracing.link(None) is None

job = Job(7, "k7", "send", "mail", 0, {}, Status.RUNNING, 2, 5)
lease = Lease(7, "host:1:w:1", 2)
for given in (stored, tracing.link(stored), None, "garbage"):
    run = tracing.start_run(job, lease, given)
    run.end("done")
    assert not run.end("failed")  # once
child, linked, root, bad = exporter.get_finished_spans()
assert (child.context.trace_id, child.parent.span_id) == (0x1234, 0x5678)
assert child.context.trace_state.get("vendor") == "v1"
assert linked.parent is None and [l.context.span_id for l in linked.links] == [0x5678]
assert linked.context.trace_id != 0x1234
assert root.parent is None and not root.links and bad.parent is None
assert dict(child.attributes) == {
    "jobqueue.queue": "mail", "jobqueue.task": "send", "jobqueue.task_key": "k7", "jobqueue.job_id": 7,
    "jobqueue.attempt": 2, "jobqueue.max_attempts": 5, "jobqueue.lease_owner": "host:1:w:1",
    "jobqueue.outcome": "done",
}
assert child.name == "jobqueue.run send" and child.kind == trace.SpanKind.CONSUMER
print("ok")
"""


def test_stored_contexts_and_the_spans_made_from_them():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
