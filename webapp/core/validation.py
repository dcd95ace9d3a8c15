"""Checks on everything a caller asks to enqueue. Bad input raises ValidationError before any
write, so the CLI (exit 2), the HTTP API (4xx) and Python callers reject the same things."""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from .errors import PayloadTooLarge, ValidationError
from .tasks import TASKS, Registry

ENV_MAX_PAYLOAD = "JOBQUEUE_MAX_PAYLOAD_BYTES"
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
MAX_DELAY_SECONDS = 366 * 24 * 3600
PRIORITY_RANGE = (-32768, 32767)   # SMALLINT; lower runs first
MAX_ATTEMPTS_RANGE = (1, 1000)
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def max_payload_bytes() -> int:
    return int(os.environ.get(ENV_MAX_PAYLOAD, DEFAULT_MAX_PAYLOAD_BYTES))


@dataclass(frozen=True)
class NewJob:
    task_name: str
    task_key: str
    payload: dict[str, Any]
    queue: str
    priority: int
    delay_seconds: float
    max_attempts: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_task_key(task_key: Any) -> str:
    if not isinstance(task_key, str):
        raise ValidationError("task_key must be a string", "task_key")
    if not 1 <= len(task_key) <= 80:
        raise ValidationError(f"task_key must be 1-80 characters, got {len(task_key)}", "task_key")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in task_key):
        raise ValidationError("task_key must not contain control characters", "task_key")
    if task_key.strip() != task_key:
        raise ValidationError("task_key must not start or end with whitespace", "task_key")
    return task_key


def check_payload(payload: Any) -> dict[str, Any]:
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise ValidationError(f"payload must be a JSON object, got {type(payload).__name__}", "payload")
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"payload is not valid JSON: {exc}", "payload") from None
    limit = max_payload_bytes()
    size = len(encoded.encode("utf-8"))
    if size > limit:
        raise PayloadTooLarge(f"payload is {size} bytes, over the limit of {limit}", "payload")
    # What we store is exactly what the handler will read back.
    return json.loads(encoded)


def new_job(task_name: Any, task_key: Any, payload: Any = None, *, queue: Any = None, priority: Any = 0,
            delay: Any = 0, max_attempts: Any = None, registry: Registry = TASKS) -> NewJob:
    if not isinstance(task_name, str) or not task_name:
        raise ValidationError("task name must be a non-empty string", "task")
    spec = registry.get(task_name)
    if spec is None:
        known = ", ".join(registry.names()) or "none"
        raise ValidationError(f"unknown task {task_name!r} (registered: {known})", "task")
    task_key = check_task_key(task_key)
    payload = check_payload(payload)

    queue = spec.queue if queue is None else queue
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise ValidationError("queue must be 1-64 characters of letters, digits, '_', '.' or '-'", "queue")

    if not _is_int(priority) or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise ValidationError(f"priority must be an integer in {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}", "priority")

    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay) \
            or not 0 <= delay <= MAX_DELAY_SECONDS:
        raise ValidationError(f"delay must be a number of seconds in 0..{MAX_DELAY_SECONDS}", "delay")

    max_attempts = spec.max_attempts if max_attempts is None else max_attempts
    if not _is_int(max_attempts) or not MAX_ATTEMPTS_RANGE[0] <= max_attempts <= MAX_ATTEMPTS_RANGE[1]:
        raise ValidationError(f"max_attempts must be an integer in {MAX_ATTEMPTS_RANGE[0]}..{MAX_ATTEMPTS_RANGE[1]}",
                              "max_attempts")
    return NewJob(task_name, task_key, payload, queue, priority, float(delay), max_attempts)
