"""OpenTelemetry (the `jobqueue[otel]` extra): every use of it is here, and nothing else imports it.

- An enqueue made while a span is current stores that span's context with the job
  (`job_queue.trace_context`, W3C `traceparent` and, when it fits, `tracestate`: `current()`).
- The worker runs each attempt's handler inside a span `jobqueue.run <task>` (kind CONSUMER):
  a child of the stored context, so an attempt and its retries are spans of the enqueuer's
  trace; a batch's callbacks and recurring runs are new traces *linked* to the context they
  carry (`link()`): the span that opened the batch, the span a recurring run was enqueued in.
  The span ends when the attempt's outcome is written (`jobqueue.outcome`: done, retry,
  failed, timeout, lease_lost, released, ...).
- Histograms `jobqueue.claim.duration` (a claim cycle's transaction) and
  `jobqueue.completion.duration` (from a handler's return to its outcome written), in seconds.

It is on when JOBQUEUE_OTEL is not 0 and the application set a tracer provider (for spans and
stored contexts) or a meter provider (for the histograms). Until then the API's proxy providers
would make no-op spans anyway. This module never imports opentelemetry itself: an application
that set a provider has imported it, so while `sys.modules` has no `opentelemetry.trace` the
answer is "off" at the cost of a dict lookup, and `jobqueue` commands do not pay its import
(~15 ms). Off, the queue writes no context, reads none and sends the same statements as without
the extra.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

otel_trace: Any = None  # opentelemetry.trace, once the application imported it
otel_context: Any = None
otel_metrics: Any = None
TraceContextTextMapPropagator: Any = None

if TYPE_CHECKING:
    from .models import Job, Lease

STORED_MAX = 255  # job_queue.trace_context's width
LINK = "link "  # a stored context to link to rather than continue (batch callbacks, recurring runs)
NO_RUN = nullcontext()

_off: bool | None = None  # JOBQUEUE_OTEL=0, read once
_named: dict[str, bool] = {}  # OTEL_PYTHON_*_PROVIDER set in the environment, read once
_tracer: tuple[Any, Any] | None = None  # (provider, its tracer)
_meter: tuple[Any, Any, Any] | None = None  # (provider, claim histogram, completion histogram)


def _api() -> bool:
    """Whether opentelemetry's API is loaded (by the application): its modules bound here once."""
    global otel_trace, otel_context, TraceContextTextMapPropagator
    if otel_trace is not None:
        return True
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return False
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator as propagator

    otel_context, TraceContextTextMapPropagator, otel_trace = context, propagator, trace
    return True


def _disabled() -> bool:
    global _off
    if _off is None:
        from .settings import current

        _off = not current().otel
    return _off


def reset() -> None:
    """Read JOBQUEUE_OTEL and the providers again (tests)."""
    global _off, _tracer, _meter
    _off = _tracer = _meter = None
    _named.clear()


def _provider(module: Any, attribute: str, getter: Any, variable: str) -> Any | None:
    """The global provider the application set, or None. The API's own getter checks the
    environment on every call while none is set (~1-3 us); the variable it keeps the provider in
    is read first, and the getter called only when that is gone (another version of the API) or
    the environment names a provider for it to load."""
    provider = getattr(module, attribute, getter)
    if provider is None:
        named = _named.get(variable)
        if named is None:  # read once: a provider named there is loaded by the first getter call
            named = _named[variable] = variable in os.environ
        return getter() if named else None
    return getter() if provider is getter else provider


def tracer() -> Any | None:
    """This process's tracer, or None while no tracer provider was set (or tracing is off)."""
    global _tracer
    if otel_trace is None and not _api():
        return None
    provider = _provider(otel_trace, "_TRACER_PROVIDER", otel_trace.get_tracer_provider, "OTEL_PYTHON_TRACER_PROVIDER")
    if provider is None:
        return None
    cached = _tracer
    if cached is not None and cached[0] is provider:
        return cached[1]
    off = isinstance(provider, (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)) or _disabled()
    _tracer = (provider, None if off else provider.get_tracer("jobqueue"))
    return _tracer[1]


def enabled() -> bool:
    return tracer() is not None


# --- the stored context ---------------------------------------------------------------------------


def current() -> str | None:
    """The current span's context as stored with a job, or None (no valid span, tracing off).
    A sampled-out span's context is stored too: its flags tell the worker not to record."""
    if tracer() is None:
        return None
    if not otel_trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    parent = carrier.get("traceparent")
    if parent is None:
        return None
    state = carrier.get("tracestate")
    # traceparent has no space; tracestate is dropped when the two would not fit the column.
    if state and len(parent) + 1 + len(state) <= STORED_MAX - len(LINK):
        return f"{parent} {state}"
    return parent


def link(stored: str | None) -> str | None:
    """`stored` marked to be linked to, not continued."""
    if stored is None or stored.startswith(LINK):
        return stored
    return LINK + stored


def _extract(stored: str) -> Any | None:
    """The SpanContext in `stored`, or None when it does not parse."""
    parent, _, state = stored.partition(" ")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    ctx = TraceContextTextMapPropagator().extract(carrier)
    span_context = otel_trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


# --- an attempt's span ----------------------------------------------------------------------------


class Run:
    """One attempt's span, from its handler's start to its outcome written (from whichever
    thread writes it: the slot's, the claim loop's, the renewer's on a timeout)."""

    __slots__ = ("span", "_lock", "_ended")

    def __init__(self, span: Any):
        self.span = span
        self._lock = threading.Lock()
        self._ended = False

    def active(self) -> Any:
        """The span as the current one while the handler runs: the handler's own spans are its children."""
        return otel_trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False)

    def raised(self, exc: BaseException) -> None:
        self.span.record_exception(exc)
        self.span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:300]))

    def end(self, outcome: str) -> bool:
        """Set the outcome and end the span, once (later calls do nothing). False if it had ended."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
        self.span.set_attribute("jobqueue.outcome", outcome)
        if outcome in ("timeout", "lease_lost"):  # retry and failed carry the handler's exception already
            self.span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, outcome))
        self.span.end()
        return True


def start_run(job: Job, lease: Lease, stored: str | None) -> Run | None:
    """The span of an attempt whose handler starts now, or None while tracing is off."""
    t = tracer()
    if t is None:
        return None
    links = None
    parent = otel_context.Context()  # a new trace unless the job carries one to continue
    if stored:
        linked = stored.startswith(LINK)
        span_context = _extract(stored[len(LINK) :] if linked else stored)
        if span_context is not None:
            if linked:
                links = [otel_trace.Link(span_context)]
            else:
                parent = otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(span_context), parent)
    span = t.start_span(
        f"jobqueue.run {job.task_name}",
        context=parent,
        kind=otel_trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "jobqueue.queue": job.queue,
            "jobqueue.task": job.task_name,
            "jobqueue.task_key": job.task_key,
            "jobqueue.job_id": job.id,
            "jobqueue.attempt": lease.attempt,
            "jobqueue.max_attempts": job.max_attempts,
            "jobqueue.lease_owner": lease.owner,
        },
    )
    return Run(span)


def active(run: Run | None) -> Any:
    return NO_RUN if run is None else run.active()


# --- metrics --------------------------------------------------------------------------------------


def _histograms() -> tuple[Any, Any] | None:
    global _meter, otel_metrics
    if otel_metrics is None:
        otel_metrics = sys.modules.get("opentelemetry.metrics._internal")  # where the API keeps its provider
        if otel_metrics is None:
            return None
    provider = _provider(otel_metrics, "_METER_PROVIDER", otel_metrics.get_meter_provider, "OTEL_PYTHON_METER_PROVIDER")
    if provider is None:
        return None
    cached = _meter
    if cached is not None and cached[0] is provider:
        return None if cached[1] is None else (cached[1], cached[2])
    if type(provider).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider") or _disabled():
        _meter = (provider, None, None)
        return None
    meter = provider.get_meter("jobqueue")
    claim = meter.create_histogram(
        "jobqueue.claim.duration", unit="s", description="A claim cycle's transaction, from BEGIN to COMMIT"
    )
    completion = meter.create_histogram(
        "jobqueue.completion.duration",
        unit="s",
        description="From a handler's return (or raise) to its attempt's outcome written",
    )
    _meter = (provider, claim, completion)
    return claim, completion


def claimed(seconds: float, queues: str) -> None:
    histograms = _histograms()
    if histograms is not None:
        histograms[0].record(seconds, {"jobqueue.queues": queues})


def completed(seconds: float, queue: str, outcome: str) -> None:
    histograms = _histograms()
    if histograms is not None:
        histograms[1].record(seconds, {"jobqueue.queue": queue, "jobqueue.outcome": outcome})
