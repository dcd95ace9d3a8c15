"""Checks on everything a caller asks to enqueue. Bad input raises ValidationError before any
write, so the CLI (exit 2), the HTTP API (4xx) and Python callers reject the same things."""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import PayloadTooLarge, ValidationError
from .settings import current
from .tasks import TASKS, Registry, TaskSpec, handled_elsewhere

# MariaDB's JSON check refuses documents nested 32 levels or more (error 4025); MySQL allows 100.
# Refused here first, with a clear error, so that a client is never told "try again" for a
# payload that can never be stored.
MAX_PAYLOAD_DEPTH = 20
MAX_DELAY_SECONDS = 366 * 24 * 3600
PRIORITY_RANGE = (-32768, 32767)  # SMALLINT; lower runs first
MAX_ATTEMPTS_RANGE = (1, 1000)
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # fullmatch: "$" would let a final newline through


# Jobs per batch: a POST /api/jobs array at most, and a transaction of `jobqueue enqueue-many`.
MAX_BATCH_JOBS = 1000
# The fields of one job, as POST /api/jobs and `jobqueue enqueue-many` take them.
ENQUEUE_FIELDS = frozenset(
    {"task", "task_key", "payload", "queue", "priority", "delay", "max_attempts", "allow_unregistered"}
)
# POST /api/jobs with one job (not an array) may also wait for others (repository/dependencies.py)
# and be a member of a batch (repository/batches.py).
SINGLE_ENQUEUE_FIELDS = ENQUEUE_FIELDS | {"after", "on_parent_failure", "batch"}


def job_spec(value: Any) -> dict[str, Any]:
    """A job as JSON gives it: an object with only ENQUEUE_FIELDS (each checked by new_job)."""
    if not isinstance(value, dict):
        raise ValidationError(f"a job must be a JSON object, got {type(value).__name__}")
    if value.keys() <= ENQUEUE_FIELDS:
        return value
    unknown = sorted(set(value) - ENQUEUE_FIELDS)
    if unknown:
        raise ValidationError(f"unknown fields: {', '.join(map(repr, unknown))[:200]}", unknown[0])
    return value


def max_payload_bytes() -> int:
    return current().max_payload_bytes


class NewJob(NamedTuple):
    """A job checked by new_job, ready to be written (immutable). A named tuple rather than a
    dataclass: one object per job instead of an object and its __dict__, so half the objects the
    garbage collector tracks (a batch of 1,000 builds 1,000: 1-2 us of the 5 a job may take)."""

    task_name: str
    task_key: str
    payload: dict[str, Any]
    queue: str
    priority: int
    delay_seconds: float
    max_attempts: int
    concurrency_key: str | None = None  # "<task>:<value of payload[spec.concurrency_key]>"
    concurrency_limit: int | None = None
    # The payload's text as stored (json.dumps of `payload`, the form SQLAlchemy's JSON type
    # always stored, which the dashboard's search matches), made by check_payload. None for a
    # NewJob built by hand.
    payload_json: str | None = None
    rate_bucket: str | None = None  # "<task>" or "<task>:<value of payload[spec.rate_key]>"
    rate_limit: str | None = None  # the task's, such as "100/m"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole(value: Any) -> Any:
    """A JSON number with nothing after the point (3.0) is the integer 3, as JSON Schema counts
    it; anything else is returned as it came, for the checks to refuse."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def check_queue(queue: object) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        raise ValidationError("queue must be 1-64 characters of letters, digits, '_', '.' or '-'", "queue")
    return queue


# Printable ASCII, no space at either end: the keys nearly everyone uses, accepted without looking
# at each character's Unicode category (a batch of 1,000 jobs checks 1,000 keys).
_PLAIN_KEY = re.compile(r"[!-~](?:[ -~]{0,78}[!-~])?")


def check_task_key(task_key: Any) -> str:
    if type(task_key) is str and _PLAIN_KEY.fullmatch(task_key):
        return task_key
    if not isinstance(task_key, str):
        raise ValidationError("task_key must be a string", "task_key")
    if not 1 <= len(task_key) <= 80:
        raise ValidationError(f"task_key must be 1-80 characters, got {len(task_key)}", "task_key")
    # Cc control characters, Cs lone surrogates, Zl / Zp line and paragraph separators (U+2028,
    # U+2029), which split a log line as surely as a newline does.
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ch == "\x85" for ch in task_key):
        raise ValidationError("task_key must not contain control characters or line separators", "task_key")
    if task_key.strip() != task_key:
        raise ValidationError("task_key must not start or end with whitespace", "task_key")
    return task_key


MAX_REASON_CHARS = 4000


def check_reason(reason: Any) -> str | None:
    """An operator's reason for failing a job: text (newlines allowed, it is shown as a block),
    valid Unicode (a lone surrogate cannot be stored), at most MAX_REASON_CHARS."""
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise ValidationError("reason must be a string", "reason")
    if any(unicodedata.category(ch) == "Cs" for ch in reason):
        raise ValidationError("reason holds a lone surrogate (such as \\ud800), which is not valid Unicode", "reason")
    if len(reason) > MAX_REASON_CHARS:
        raise ValidationError(f"reason is longer than {MAX_REASON_CHARS} characters", "reason")
    return reason


def check_payload(payload: Any, limit: int | None = None) -> dict[str, Any]:
    """The payload as the handler will read it back; `limit` is the size limit in bytes (read
    from the settings when not given: a batch reads them once)."""
    return checked_payload(payload, limit)[0]


# Encoders made once: json.dumps with any non-default argument builds a new one per call.
# _STORED writes json.dumps' own form, the text SQLAlchemy's JSON type always stored (the
# dashboard's search matches it); the size limit counts _COMPACT's, in UTF-8.
_STORED = json.JSONEncoder(allow_nan=False)
_COMPACT = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_DECODER = json.JSONDecoder()


def _stored_text() -> Callable[[Any], str]:
    """_STORED.encode, minus what it does per call besides encoding (a closure, a dict of
    markers and a C encoder built anew each time: a third of encoding a small payload). The C
    encoder it would build is built once; without markers, a circular payload raises
    RecursionError, as one nested too deeply does. Without json's C speedups, _STORED.encode."""
    make = json.encoder.c_make_encoder
    if make is None:
        return _STORED.encode
    encode = make(
        None,
        _STORED.default,
        json.encoder.encode_basestring_ascii,
        _STORED.indent,
        _STORED.key_separator,
        _STORED.item_separator,
        _STORED.sort_keys,
        _STORED.skipkeys,
        _STORED.allow_nan,
    )
    return lambda payload: "".join(encode(payload, 0))


_stored = _stored_text()


def checked_payload(payload: Any, limit: int | None = None) -> tuple[dict[str, Any], str]:
    """check_payload's payload and the text it is stored as."""
    if payload is None:
        return {}, "{}"
    if not isinstance(payload, dict):
        raise ValidationError(f"payload must be a JSON object, got {type(payload).__name__}", "payload")
    if not payload:
        return {}, "{}"
    try:
        stored = _stored(payload)
    except RecursionError:
        stored = None  # nested far too deep: _depth below says how deep
    except (TypeError, ValueError) as exc:
        _check_depth(payload)
        raise ValidationError(f"payload is not valid JSON: {exc}", "payload") from None
    # Nesting can be no deeper than the brackets in the text: most payloads are counted, not walked.
    if stored is None or stored.count("{") + stored.count("[") > MAX_PAYLOAD_DEPTH:
        _check_depth(payload)
        if stored is None:
            raise ValidationError("payload is not valid JSON: nested too deeply", "payload")
    if limit is None:
        limit = max_payload_bytes()
    # The stored text is never shorter than the compact UTF-8 form (it adds spaces and writes
    # every non-ASCII character as a longer \u escape), and a lone surrogate shows in it as
    # "\ud...": only such payloads are encoded a second time, to be measured exactly.
    if len(stored) > limit or "\\ud" in stored:
        try:
            size = len(_COMPACT.encode(payload).encode("utf-8"))
        except UnicodeEncodeError:
            raise ValidationError(
                "payload holds a lone surrogate (such as \\ud800), which is not valid Unicode", "payload"
            ) from None
        if size > limit:
            raise PayloadTooLarge(f"payload is {size} bytes, over the limit of {limit}", "payload")
    # What we store is exactly what the handler will read back: the payload itself when it holds
    # only what JSON gives back as it was (a look at each value's type costs a fifth of decoding
    # the text: payloads that came as JSON always do), else the stored text decoded (raw_decode:
    # json.loads less its two whitespace scans, which text from _stored never has).
    return (payload if _as_read_back(payload) else _DECODER.raw_decode(stored)[0]), stored


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _as_read_back(value: Any) -> bool:
    """Whether decoding value's JSON gives back an equal value of the same types: dicts with str
    keys, lists, str, int, float, bool and None (a tuple comes back a list, an int key a str key,
    a subclass its base). Called on encoded payloads, so nested at most MAX_PAYLOAD_DEPTH deep."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _as_read_back(item)):
                return False
        return True
    if kind is list:
        for item in value:
            if type(item) not in _SCALARS and not _as_read_back(item):
                return False
        return True
    return kind in _SCALARS


def _check_depth(payload: dict[str, Any]) -> None:
    depth = _depth(payload)
    if depth > MAX_PAYLOAD_DEPTH:
        raise ValidationError(
            f"payload is nested {depth} levels deep; at most {MAX_PAYLOAD_DEPTH} are allowed", "payload"
        )


def _depth(value: Any, limit: int = MAX_PAYLOAD_DEPTH + 1) -> int:
    """How deeply lists and objects nest (a flat object is 1), counted without recursion and
    without looking deeper than `limit`."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level >= limit:
                return level
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


MAX_TASK_NAME_CHARS = 100  # job_queue.task_name
# A batch's callback task: printable ASCII, no space at either end (web/openapi.py says the same).
CALLBACK_TASK = re.compile(f"[!-~](?:[ -~]{{0,{MAX_TASK_NAME_CHARS - 2}}}[!-~])?")


def check_task_name(name: str) -> str:
    """A task name no code registered (allow_unregistered): one that fits the column and prints."""
    if len(name) > MAX_TASK_NAME_CHARS or not name.isprintable() or name != name.strip():
        raise ValidationError(
            f"task name must be 1-{MAX_TASK_NAME_CHARS} printable characters, without spaces around it", "task"
        )
    return name


def new_job(
    task_name: Any,
    task_key: Any,
    payload: Any = None,
    *,
    queue: Any = None,
    priority: Any = 0,
    delay: Any = 0,
    max_attempts: Any = None,
    registry: Registry = TASKS,
    max_payload: int | None = None,
    allow_unregistered: bool = False,
) -> NewJob:
    """The job, checked; `max_payload` is the payload size limit (default: the settings').
    A task that `registry` does not know is refused, unless `allow_unregistered`: then it takes
    the default queue and attempts, and the worker that imports it decides the rest."""
    if not isinstance(task_name, str) or not task_name:
        raise ValidationError("task name must be a non-empty string", "task")
    if not isinstance(allow_unregistered, bool):
        raise ValidationError("allow_unregistered must be true or false", "allow_unregistered")
    spec = registry.get(task_name)
    if spec is None and allow_unregistered:
        spec = TaskSpec(check_task_name(task_name), handled_elsewhere)
    if spec is None:
        known = ", ".join(registry.names()) or "none"
        raise ValidationError(
            f"unknown task {task_name!r}: neither this process nor any worker registered it "
            f"(registered: {known}); to enqueue it before its worker starts, allow it "
            '(allow_unregistered=True, --allow-unregistered, "allow_unregistered": true)',
            "task",
        )
    task_key = check_task_key(task_key)
    payload, payload_json = checked_payload(payload, max_payload)

    queue = check_queue(spec.queue if queue is None else queue)

    priority = _whole(priority)
    if not _is_int(priority) or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ValidationError(f"priority must be an integer in {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}", "priority")

    if (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY_SECONDS
    ):
        raise ValidationError(f"delay must be a number of seconds in 0..{MAX_DELAY_SECONDS}", "delay")

    max_attempts = spec.max_attempts if max_attempts is None else _whole(max_attempts)
    if not _is_int(max_attempts) or not MAX_ATTEMPTS_RANGE[0] <= max_attempts <= MAX_ATTEMPTS_RANGE[1]:
        raise ValidationError(
            f"max_attempts must be an integer in {MAX_ATTEMPTS_RANGE[0]}..{MAX_ATTEMPTS_RANGE[1]}", "max_attempts"
        )
    key = None
    if spec.concurrency_key is not None:
        key = concurrency_key_of(task_name, spec.concurrency_key, payload)
    return NewJob(
        task_name,
        task_key,
        payload,
        queue,
        priority,
        float(delay),
        max_attempts,
        key,
        spec.concurrency_limit if key is not None else None,
        payload_json,
        *_rate(task_name, spec, payload),
    )


def _rate(task_name: str, spec: Any, payload: dict[str, Any]) -> tuple[str | None, str | None]:
    """The job's rate bucket and its limit: one bucket per task, or per value of its rate_key;
    a payload without that field (or with a value that is not a string or number) goes in the
    task's bucket shared by all such jobs, rather than being refused."""
    if spec.rate_limit is None:
        return None, None
    field = spec.rate_key
    if (
        field is None
        or field not in payload
        or payload[field] is None
        or isinstance(payload[field], (bool, dict, list))
    ):
        return task_name, spec.rate_limit
    value = payload[field]
    text = value if isinstance(value, str) else json.dumps(value)
    bucket = f"{task_name}:{text}"
    if len(bucket) > MAX_KEY_CHARS:
        bucket = f"{task_name}:sha256:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}"
    return bucket, spec.rate_limit


MAX_KEY_CHARS = 200


def concurrency_key_of(task_name: str, field: str, payload: dict[str, Any]) -> str:
    """The job's concurrency key, `<task>:<payload[field]>`; a payload without the field is
    refused (the job could not be placed under its limit). Long values are hashed to fit."""
    if field not in payload:
        raise ValidationError(
            f"payload lacks {field!r}: task {task_name!r} limits how many jobs with the same {field!r} run at once",
            "payload",
        )
    value = payload[field]
    if value is None or isinstance(value, (bool, dict, list)):  # bool: the API documents string or number
        raise ValidationError(
            f"payload[{field!r}] must be a string or a number (it is task {task_name!r}'s concurrency key)", "payload"
        )
    text = value if isinstance(value, str) else json.dumps(value)
    key = f"{task_name}:{text}"
    if len(key) > MAX_KEY_CHARS:
        key = f"{task_name}:sha256:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}"
    return key


# --- listing jobs (the dashboard's filters, GET /api/jobs, `jobqueue list`) --------------------------

MAX_FILTER_CHARS = 100
MAX_SEARCH_CHARS = 200
MAX_LIST_LIMIT = 500
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() takes "²", int() does not


@dataclass(frozen=True)
class JobQuery:
    job_filter: Any  # repository.operator.JobFilter
    before: int | None
    after: int | None
    limit: int


def whole_number(value: Any, name: str, *, low: int = 0, high: int = 10**18 - 1, strict: bool = False) -> int | None:
    """A positive whole number given as text or int (None when absent, or empty unless `strict`);
    ValidationError otherwise."""
    if value is None or (isinstance(value, str) and not value.strip() and not strict):
        return None
    if _is_int(value):
        number = value
    elif isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise ValidationError(f"{name} must be a whole number", name)
    if not low <= number <= high:
        raise ValidationError(f"{name} must be in {low}..{high}", name)
    return number


def _filter_text(value: Any, name: str, limit: int, strict: bool = False) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be text", name)
    if strict and not value:
        raise ValidationError(f"{name} is empty; leave it out instead", name)
    if strict and any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValidationError(f"{name} must not contain control characters", name)
    value = value.strip()
    if len(value) > limit:
        raise ValidationError(f"{name} is longer than {limit} characters", name)
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValidationError(f"{name} must not contain control characters", name)
    return value or None


def job_query(args: Any, *, default_limit: int = 50, max_limit: int = MAX_LIST_LIMIT, strict: bool = False) -> JobQuery:
    """The filters and keyset position of a job listing from `args` (a mapping of text: query
    arguments, a form, CLI options): status, queue, task, key (task_key prefix), q (search in
    payload, last error and task_key), batch (a batch's members), before / after (keyset), limit. Bad input raises
    ValidationError naming the field; nothing is read or written before that. `strict` (the JSON
    API): an argument given empty or with a control character anywhere is refused, not ignored."""
    from .models import Status
    from .repository.operator import JobFilter

    status = _filter_text(args.get("status"), "status", 20, strict)
    if status is not None and status not in {s.value for s in Status}:
        known = ", ".join(s.value for s in Status)
        raise ValidationError(f"unknown status {status!r} (one of {known})", "status")
    before = whole_number(args.get("before"), "before", low=1, strict=strict)
    after = whole_number(args.get("after"), "after", low=0, strict=strict)
    if before is not None and after is not None:
        raise ValidationError("give before or after, not both", "after")
    limit = whole_number(args.get("limit"), "limit", low=1, high=max_limit, strict=strict)
    job_filter = JobFilter(
        status=Status(status) if status else None,
        queue=_filter_text(args.get("queue"), "queue", MAX_FILTER_CHARS, strict),
        task=_filter_text(args.get("task"), "task", MAX_FILTER_CHARS, strict),
        key_prefix=_filter_text(args.get("key"), "key", 80, strict),
        search=_filter_text(args.get("q"), "q", MAX_SEARCH_CHARS, strict),
        min_id=whole_number(args.get("min_id"), "min_id", strict=strict),
        batch=_filter_text(args.get("batch"), "batch", 64, strict),
    )
    return JobQuery(job_filter, before, after, limit or default_limit)
