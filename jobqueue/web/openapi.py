"""The JSON API's contract, served at /api/openapi.json (OpenAPI 3.1).

Kept true two ways: tests/web/test_openapi.py compares its paths and methods with the app's
/api/ routes (a new endpoint must be added to PATHS below), and schemathesis sends generated
requests to every operation and checks each answer against what is written here.
"""

from __future__ import annotations

from typing import Any

from ..core.models import Status
from ..core.repository.explain import CODES as EXPLAIN_CODES
from ..core.repository.operator import SEARCH_WINDOW, SPARSE_SEARCH_WINDOW
from ..core.validation import (
    MAX_ATTEMPTS_RANGE,
    MAX_BATCH_JOBS,
    MAX_DELAY_SECONDS,
    MAX_FILTER_CHARS,
    MAX_LIST_LIMIT,
    MAX_REASON_CHARS,
    MAX_SEARCH_CHARS,
    PRIORITY_RANGE,
)

STATUSES = [s.value for s in Status]
REASON_CODES = list(EXPLAIN_CODES)
MAX_JOB_ID = 2**63 - 1
MAX_RESULT_WAIT = 30  # api.MAX_RESULT_WAIT
MAX_LIST_ID = 10**18 - 1  # validation.whole_number: 18 digits at most
# A listing's text filters: no Cc control character anywhere (validation.job_query, strict).
FILTER_TEXT_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f]*(?![\\s\\S])"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str, headers: dict | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


def _error(description: str, headers: dict | None = None) -> dict[str, Any]:
    return _json(_ref("Error"), description, headers)


RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before trying again",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
UNAUTHORIZED = _error(
    "no bearer token, or not a known one", {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
)
FORBIDDEN = _error("the token can read but not act")
UNAVAILABLE = _error("the database is unreachable, busy (a lock held too long) or not a writable primary", RETRY_AFTER)
BAD_BODY = _error("the body is not JSON, not an object, or nested too deeply to read")
TOO_LARGE = _error("the body is larger than the payload limit allows")
INVALID_FIELD = _json(
    {"allOf": [_ref("Error"), {"type": "object", "required": ["field"]}]},
    "a field is unknown or has a value the queue does not take (`field` names it)",
)
NAME_PATTERN = "^[A-Za-z0-9_.\\-]{{1,{n}}}(?![\\s\\S])"
QUEUE_PARAM = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": NAME_PATTERN.format(n=64)},
}
NAME_PARAM = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": NAME_PATTERN.format(n=50)},
}
JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_JOB_ID},
}


def _operator_action(summary: str, body: dict[str, Any], acted: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "operationId": acted,
        "parameters": [JOB_ID],
        "requestBody": {"required": False, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": _json(_ref("ActionResult"), "done (`changed` is false when there was nothing to do)"),
            "400": BAD_BODY,
            "401": UNAUTHORIZED,
            "403": FORBIDDEN,
            "404": _error("no such job"),
            "409": _json(
                {
                    "allOf": [
                        _ref("Error"),
                        {
                            "type": "object",
                            "properties": {"status": {"enum": STATUSES}, "needs": {"enum": ["force", "again"]}},
                        },
                    ]
                },
                "the job's state does not allow it; `needs: force` when a running job's lease is still valid, "
                "`needs: again` to run a done job again",
            ),
            "413": TOO_LARGE,
            "422": INVALID_FIELD,
            "423": _error("a worker is claiming the job this instant: try again", RETRY_AFTER),
            "503": UNAVAILABLE,
        },
    }


PATHS: dict[str, dict[str, Any]] = {
    "/api/jobs": {
        "post": {
            "summary": f"Enqueue a job, or an array of up to {MAX_BATCH_JOBS:,} jobs in one transaction (idempotent "
            "by task_key); nothing is written on any error",
            "operationId": "enqueue",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "oneOf": [
                                _ref("NewSingleJob"),
                                {
                                    "type": "array",
                                    "items": _ref("NewJob"),
                                    "maxItems": MAX_BATCH_JOBS,
                                    "description": "a batch: all written or none; one result per job, in order",
                                },
                            ]
                        }
                    }
                },
            },
            "responses": {
                "201": _json(
                    {"oneOf": [_ref("Enqueued"), {"type": "array", "items": _ref("Enqueued")}]},
                    "created (a batch: at least one of its jobs)",
                ),
                "200": _json(
                    {"oneOf": [_ref("Enqueued"), {"type": "array", "items": _ref("Enqueued")}]},
                    "a known task_key: the existing job, `duplicate: true`, nothing written (a batch: every "
                    "task_key was known, or the array was empty)",
                ),
                "400": BAD_BODY,
                "401": UNAUTHORIZED,
                "403": FORBIDDEN,
                "413": _error(
                    "the body is larger than the payload limit allows, or a batch holds more than "
                    f"{MAX_BATCH_JOBS} jobs or more than 16 MiB"
                ),
                "422": _json(
                    {
                        "allOf": [
                            _ref("Error"),
                            {
                                "type": "object",
                                "required": ["field"],
                                "properties": {
                                    "index": {
                                        "type": "integer",
                                        "minimum": 0,
                                        "description": "a batch: the position of the job refused",
                                    }
                                },
                            },
                        ]
                    },
                    "a field is unknown or has a value the queue does not take (`field` names it; in a batch, `index` "
                    "names the job)",
                ),
                "404": _error("`batch` names no batch"),
                "409": _error("`batch` names a closed batch"),
                "503": UNAVAILABLE,
            },
        },
        "get": {
            "summary": "Jobs matching the dashboard's filters, newest first, keyset-paged (pass next_before as before)",
            "operationId": "list_jobs",
            "parameters": [
                {"name": "status", "in": "query", "schema": {"enum": STATUSES}},
                *(
                    {
                        "name": name,
                        "in": "query",
                        "description": what,
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": limit,
                            "pattern": FILTER_TEXT_PATTERN,
                        },
                    }
                    for name, limit, what in (
                        ("queue", MAX_FILTER_CHARS, "queue name"),
                        ("task", MAX_FILTER_CHARS, "task name"),
                        ("key", 80, "task_key prefix"),
                        ("batch", 64, "a batch's key: its member jobs"),
                        (
                            "q",
                            MAX_SEARCH_CHARS,
                            "text in the payload, the last error or the task_key, "
                            f"case-blind; reads at most the newest {SEARCH_WINDOW:,} jobs "
                            f"matching the other filters ({SPARSE_SEARCH_WINDOW:,} inside "
                            "a status, a task or a key prefix)",
                        ),
                    )
                ),
                {"name": "before", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_ID}},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
                },
            ],
            "responses": {
                "200": _json(_ref("JobPage"), "a page of jobs"),
                "400": INVALID_FIELD,
                "401": UNAUTHORIZED,
                "503": UNAVAILABLE,
            },
        },
    },
    "/api/jobs/{job_id}": {
        "get": {
            "summary": "A job, its result and its failed attempts",
            "operationId": "get_job",
            "parameters": [JOB_ID],
            "responses": {
                "200": _json(_ref("JobDetail"), "the job"),
                "401": UNAUTHORIZED,
                "404": _error("no such job"),
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/jobs/{job_id}/result": {
        "get": {
            "summary": "A job's result: 200 once it finished (done, failed or cancelled: branch on status; result is "
            "what its handler returned or recorded, error its last error), 202 while it has not",
            "operationId": "job_result",
            "parameters": [
                JOB_ID,
                {
                    "name": "wait",
                    "in": "query",
                    "description": "long poll: answer as soon as the job finishes, or after this many seconds with 202",
                    "schema": {"type": "number", "minimum": 0, "maximum": MAX_RESULT_WAIT},
                },
            ],
            "responses": {
                "200": _json(_ref("JobResult"), "the job finished: done, failed or cancelled"),
                "202": _json(_ref("JobResult"), "not finished yet (scheduled, ready or running): ask again"),
                "400": INVALID_FIELD,
                "401": UNAUTHORIZED,
                "404": _error("no such job"),
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/jobs/{job_id}/explain": {
        "get": {
            "summary": "Why a job is (not) running: its reasons, the main one first. Reads only, and waits at most "
            "about a second on a row another transaction holds; SQL text only for admin tokens",
            "operationId": "explain_job",
            "parameters": [JOB_ID],
            "responses": {
                "200": _json(_ref("Explanation"), "the reasons"),
                "401": UNAUTHORIZED,
                "404": _error("no such job"),
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/jobs/{job_id}/requeue": {
        "post": _operator_action(
            "Put a job back to ready now (NOWAIT); a running job with a valid lease needs force, a done job again "
            "(its handler runs again; record_result keeps the one result row of its task_key)",
            {
                "type": "object",
                "properties": {"force": {"type": "boolean"}, "again": {"type": "boolean"}},
                "additionalProperties": False,
            },
            "requeue",
        )
    },
    "/api/jobs/{job_id}/fail": {
        "post": _operator_action(
            "Mark a job failed now (NOWAIT), with the reason kept",
            {
                "type": "object",
                "properties": {"reason": {"type": ["string", "null"], "maxLength": MAX_REASON_CHARS}},
                "additionalProperties": False,
            },
            "fail",
        )
    },
    "/api/jobs/{job_id}/cancel": {
        "post": _operator_action(
            "Cancel a job that has not finished (ready, scheduled, failed; a running one is told to stop and ends "
            "cancelled), with the reason kept; NOWAIT",
            {
                "type": "object",
                "properties": {"reason": {"type": ["string", "null"], "maxLength": MAX_REASON_CHARS}},
                "additionalProperties": False,
            },
            "cancel",
        )
    },
    "/api/queues": {
        "get": {
            "summary": "Every known queue: paused or not, who changed it and when, its counts by status (capped)",
            "operationId": "list_queues",
            "responses": {"200": _json(_ref("Queues"), "the queues"), "401": UNAUTHORIZED, "503": UNAVAILABLE},
        }
    },
    **{
        f"/api/queues/{{queue}}/{verb}": {
            "post": {
                "summary": f"{verb.capitalize()} a queue ({what}); doing it twice is not an error (`changed: false`)",
                "operationId": f"{verb}_queue",
                "parameters": [QUEUE_PARAM],
                "responses": {
                    "200": _json(_ref("QueuePaused"), "done"),
                    "401": UNAUTHORIZED,
                    "403": FORBIDDEN,
                    "422": INVALID_FIELD,
                    "503": UNAVAILABLE,
                },
            }
        }
        for verb, what in (
            ("pause", "no worker claims from it; running jobs finish"),
            ("resume", "workers claim from it again"),
        )
    },
    "/api/queues/{queue}/scale": {
        "get": {
            "summary": "For autoscalers (KEDA's metrics-api scaler): a queue's ready and running counts and its oldest "
            "ready job's age, read fresh; zeros for a queue with no jobs",
            "operationId": "queue_scale",
            "parameters": [QUEUE_PARAM],
            "responses": {
                "200": _json(_ref("QueueScale"), "the signal"),
                "401": UNAUTHORIZED,
                "422": INVALID_FIELD,
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/recurring": {
        "get": {
            "summary": "Every recurring job (cron schedule) by name",
            "operationId": "list_recurring",
            "responses": {
                "200": _json(_ref("RecurringList"), "the schedules"),
                "401": UNAUTHORIZED,
                "503": UNAVAILABLE,
            },
        },
        "post": {
            "summary": "Add a recurring job, or replace the definition of the one of that name (it stays enabled or "
            "disabled); validated whole before anything is written",
            "operationId": "add_recurring",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("NewRecurring")}}},
            "responses": {
                "201": _json(_ref("Recurring"), "added (`created: true`)"),
                "200": _json(_ref("Recurring"), "replaced (`created: false`)"),
                "400": BAD_BODY,
                "401": UNAUTHORIZED,
                "403": FORBIDDEN,
                "413": TOO_LARGE,
                "422": _json(
                    {"allOf": [_ref("Error"), {"type": "object", "required": ["field"]}]},
                    "a field is unknown or has a value the queue does not take, such as a cron expression "
                    "that does not parse (`field` names it)",
                ),
                "503": UNAVAILABLE,
            },
        },
    },
    **{
        f"/api/recurring/{{name}}/{verb}": {
            "post": {
                "summary": f"{verb.capitalize()} a recurring job{extra}; doing it twice is not an error (`changed: false`)",
                "operationId": f"{verb}_recurring",
                "parameters": [NAME_PARAM],
                "responses": {
                    "200": _json(_ref("Recurring"), "done"),
                    "401": UNAUTHORIZED,
                    "403": FORBIDDEN,
                    "404": _error("no recurring job of that name"),
                    "503": UNAVAILABLE,
                },
            }
        }
        for verb, extra in (
            ("enable", " (from the next tick after now: missed ticks are not caught up)"),
            ("disable", ""),
        )
    },
    "/api/recurring/{name}": {
        "delete": {
            "summary": "Remove a recurring job; the jobs it enqueued stay",
            "operationId": "remove_recurring",
            "parameters": [NAME_PARAM],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["name", "removed"],
                        "properties": {"name": {"type": "string"}, "removed": {"const": True}},
                    },
                    "removed",
                ),
                "401": UNAUTHORIZED,
                "403": FORBIDDEN,
                "404": _error("no recurring job of that name"),
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/retention": {
        "get": {
            "summary": "How long finished jobs and their keys are kept, and the last prune",
            "operationId": "retention",
            "responses": {
                "200": _json(_ref("Retention"), "the settings and the last prune"),
                "401": UNAUTHORIZED,
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/prune": {
        "post": {
            "summary": "Delete done, failed and cancelled jobs older than the given days (default: the retention "
            "settings) in small batches, for at most 10 s per request (`finished: false`: call again)",
            "operationId": "prune",
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "done_older_than": {"type": "number", "minimum": 0, "maximum": 36500},
                                "failed_older_than": {"type": "number", "minimum": 0, "maximum": 36500},
                                "dry_run": {"type": "boolean"},
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(_ref("PruneResult"), "what was (or, with dry_run, would be) deleted"),
                "400": BAD_BODY,
                "401": UNAUTHORIZED,
                "403": FORBIDDEN,
                "413": TOO_LARGE,
                "422": INVALID_FIELD,
                "503": UNAVAILABLE,
            },
        }
    },
    "/api/stats": {
        "get": {
            "summary": "Counts by queue and status (capped), the oldest ready job's age per queue",
            "operationId": "stats",
            "responses": {"200": _json(_ref("Stats"), "the counts"), "401": UNAUTHORIZED, "503": UNAVAILABLE},
        }
    },
    "/api/health": {
        "get": {
            "summary": "`jobqueue doctor`'s checks, cached for a minute per web process",
            "operationId": "health",
            "responses": {
                "200": _json(_ref("Health"), "ok, or warnings only"),
                "401": UNAUTHORIZED,
                "503": _json(_ref("Health"), "the database is unreachable or a check found a problem"),
            },
        }
    },
    "/api/openapi.json": {
        "get": {
            "summary": "This document",
            "operationId": "openapi",
            "security": [],
            "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}}
            },
        }
    },
}

TIMESTAMP = {"type": ["string", "null"], "format": "date-time"}
# validation.check_task_key as a pattern: no Cc controls (U+0085 among them), no line or paragraph
# separators, no whitespace at either end. "(?![\\s\\S])" ends it: "$" would also match before a
# final newline in Python's regular expressions (which schema validators use).
_KEY_CHAR = "[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]"
_KEY_EDGE = "[^\\s\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]"
TASK_KEY_PATTERN = f"^{_KEY_EDGE}(?:{_KEY_CHAR}*{_KEY_EDGE})?(?![\\s\\S])"

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "minLength": 1}, "field": {"type": ["string", "null"]}},
    },
    "NewJob": {
        "type": "object",
        "required": ["task", "task_key"],
        "additionalProperties": False,
        "properties": {
            "task": {
                "type": "string",
                "description": "a task name: built in, of the web process's JOBQUEUE_TASKS, "
                "or registered by a worker (unless allow_unregistered)",
            },
            "task_key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 80,
                "pattern": TASK_KEY_PATTERN,
                "description": "unique per job: no control characters, line separators or edge spaces",
            },
            "payload": {
                "type": ["object", "null"],
                "description": "at most JOBQUEUE_MAX_PAYLOAD_BYTES as JSON, 20 levels deep; null means {}. "
                "The handler gets it as sent: key order, integers of any size",
            },
            "queue": {
                "type": ["string", "null"],
                "pattern": NAME_PATTERN.format(n=64),
                "description": "null: the task's own queue",
            },
            "priority": {"type": "integer", "minimum": PRIORITY_RANGE[0], "maximum": PRIORITY_RANGE[1]},
            "delay": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS},
            "max_attempts": {
                "type": ["integer", "null"],
                "minimum": MAX_ATTEMPTS_RANGE[0],
                "maximum": MAX_ATTEMPTS_RANGE[1],
                "description": "null: the task's own",
            },
            "allow_unregistered": {
                "type": "boolean",
                "description": "take a task name no process registered yet (default false: refused as a likely typo)",
            },
        },
    },
    "Enqueued": {
        "type": "object",
        "required": ["id", "task_key", "duplicate", "status"],
        "properties": {
            "id": {"type": "integer"},
            "task_key": {"type": "string"},
            "duplicate": {"type": "boolean"},
            "status": {"enum": STATUSES + [None]},
        },
    },
    "Job": {
        "type": "object",
        "required": ["id", "task_key", "task", "queue", "status", "attempts", "max_attempts"],
        "properties": {
            "id": {"type": "integer"},
            "task_key": {"type": "string"},
            "task": {"type": "string"},
            "queue": {"type": "string"},
            "priority": {"type": "integer"},
            "status": {"enum": STATUSES},
            "attempts": {"type": "integer"},
            "max_attempts": {"type": "integer"},
            "payload": {"type": "object"},
            "lease_owner": {"type": ["string", "null"]},
            "lease_until": TIMESTAMP,
            "run_at": TIMESTAMP,
            "started_at": TIMESTAMP,
            "last_error": {"type": ["string", "null"]},
            "created_at": TIMESTAMP,
            "updated_at": TIMESTAMP,
            "finished_at": TIMESTAMP,
        },
    },
    "JobDetail": {
        "allOf": [
            _ref("Job"),
            {
                "type": "object",
                "required": ["result", "attempt_history"],
                "properties": {
                    "result": {"description": "what the handler recorded for this task_key, or null"},
                    "attempt_history": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "attempt": {"type": "integer"},
                                "worker": {"type": ["string", "null"]},
                                "started_at": TIMESTAMP,
                                "finished_at": TIMESTAMP,
                                "outcome": {"type": "string"},
                                "error": {"type": ["string", "null"]},
                            },
                        },
                    },
                },
            },
        ]
    },
    "JobResult": {
        "type": "object",
        "required": ["id", "task_key", "status", "result", "error", "finished_at"],
        "properties": {
            "id": {"type": "integer"},
            "task_key": {"type": "string"},
            "status": {"enum": STATUSES},
            "result": {
                "description": "what the handler returned or recorded (ctx.record_result); null "
                "unless done, or when it gave none"
            },
            "error": {
                "type": ["string", "null"],
                "description": "the last error of a failed or cancelled job; null otherwise",
            },
            "finished_at": TIMESTAMP,
        },
    },
    "Explanation": {
        "type": "object",
        "required": ["job_id", "status", "reasons"],
        "properties": {
            "job_id": {"type": "integer"},
            "status": {"enum": STATUSES},
            "reasons": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["code", "detail"],
                    "properties": {
                        "code": {"enum": REASON_CODES},
                        "detail": {"type": "string", "minLength": 1},
                        "connection_id": {"type": ["integer", "null"]},
                        "statement": {"type": ["string", "null"]},
                    },
                    "description": "the facts behind each code are fields beside it: ahead (runnable), run_at "
                    "(scheduled), ready_at (retry_backoff), since and by (queue_paused), processes "
                    "(no_live_worker), key and holders (concurrency_limit), connection_id, account, "
                    "transaction_age_seconds, state, statement (locked_by_transaction), owner, "
                    "lease_until, owner_alive (lease_held, lease_expired), last_error (terminal)",
                },
            },
        },
    },
    "ActionResult": {
        "type": "object",
        "required": ["id", "before", "after", "changed"],
        "properties": {
            "id": {"type": "integer"},
            "before": {"enum": STATUSES},
            "after": {"enum": STATUSES},
            "changed": {"type": "boolean"},
        },
    },
    "JobPage": {
        "type": "object",
        "required": ["jobs", "next_before", "matches", "matches_capped"],
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next_before": {
                "type": ["integer", "null"],
                "description": "`before` of the next (older) page; null: none",
            },
            "matches": {"type": "integer", "minimum": 0, "description": "jobs matching, counted up to 10,000"},
            "matches_capped": {"type": "boolean"},
            "search_window": {"type": "integer", "description": "with q: the most rows the search read"},
            "search_window_floor": {
                "type": ["integer", "null"],
                "description": "with q: the lowest id it read; null when it reached the oldest job",
            },
        },
    },
    "Stats": {
        "type": "object",
        "required": ["queues", "totals", "now"],
        "properties": {
            "queues": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "properties": {
                        **{s: {"type": "integer", "minimum": 0} for s in STATUSES},
                        "oldest_ready_age_seconds": {"type": ["number", "null"]},
                        "capped": {"type": "array", "items": {"enum": STATUSES}},
                    },
                },
            },
            "totals": {"type": "object", "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES}},
            "now": TIMESTAMP,
        },
    },
    "Queues": {
        "type": "object",
        "required": ["queues", "now"],
        "properties": {
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["queue", "paused", "counts"],
                    "properties": {
                        "queue": {"type": "string"},
                        "paused": {"type": "boolean"},
                        "changed_at": TIMESTAMP,
                        "changed_by": {"type": ["string", "null"]},
                        "counts": {
                            "type": "object",
                            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
                        },
                        "capped": {"type": "array", "items": {"enum": STATUSES}},
                    },
                },
            },
            "now": TIMESTAMP,
        },
    },
    "QueueScale": {
        "type": "object",
        "required": ["queue", "ready", "running", "oldest_ready_age_seconds", "capped", "cap", "now"],
        "properties": {
            "queue": {"type": "string"},
            "ready": {"type": "integer", "minimum": 0, "description": "ready jobs, counted up to `cap`"},
            "running": {"type": "integer", "minimum": 0, "description": "running jobs, counted up to `cap`"},
            "oldest_ready_age_seconds": {
                "type": "number",
                "minimum": 0,
                "description": "how long the oldest ready job has waited; 0 with none",
            },
            "capped": {
                "type": "array",
                "items": {"enum": ["ready", "running"]},
                "description": "the counts that reached `cap` (the true figure is larger)",
            },
            "cap": {"type": "integer"},
            "now": TIMESTAMP,
        },
    },
    "QueuePaused": {
        "type": "object",
        "required": ["queue", "paused", "changed"],
        "properties": {"queue": {"type": "string"}, "paused": {"type": "boolean"}, "changed": {"type": "boolean"}},
    },
    "NewRecurring": {
        "type": "object",
        "required": ["name", "cron", "task"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN.format(n=50)},
            "cron": {
                "type": "string",
                "description": "five fields (minute hour day month weekday) or @hourly, "
                "@daily, @weekly, @monthly, @yearly; UTC",
            },
            "task": {
                "type": "string",
                "description": "a task name: built in, of the web process's JOBQUEUE_TASKS, "
                "or registered by a worker (unless allow_unregistered)",
            },
            "payload": {"type": ["object", "null"], "description": "the payload of each run's job; null means {}"},
            "queue": {
                "type": ["string", "null"],
                "pattern": NAME_PATTERN.format(n=64),
                "description": "null: the task's own queue",
            },
        },
    },
    "Recurring": {
        "type": "object",
        "required": ["name", "cron", "task", "enabled", "next_run_at"],
        "properties": {
            "name": {"type": "string"},
            "cron": {"type": "string"},
            "task": {"type": "string"},
            "payload": {"type": "object"},
            "queue": {"type": ["string", "null"]},
            "enabled": {"type": "boolean"},
            "source": {"enum": ["operator", "code"]},
            "next_run_at": TIMESTAMP,
            "last_run_at": TIMESTAMP,
            "last_job_id": {"type": ["integer", "null"]},
            "updated_by": {"type": ["string", "null"]},
            "updated_at": TIMESTAMP,
            "created": {"type": "boolean"},
            "changed": {"type": "boolean"},
        },
    },
    "RecurringList": {
        "type": "object",
        "required": ["recurring", "now"],
        "properties": {"recurring": {"type": "array", "items": _ref("Recurring")}, "now": TIMESTAMP},
    },
    "Retention": {
        "type": "object",
        "required": ["keep_done_days", "keep_failed_days", "keep_keys_days", "last_prune"],
        "properties": {
            "keep_done_days": {"type": "number"},
            "keep_failed_days": {"type": "number"},
            "keep_keys_days": {"type": "number"},
            "last_prune": {
                "type": ["object", "null"],
                "properties": {
                    "started_at": TIMESTAMP,
                    "finished_at": TIMESTAMP,
                    "by": {"type": "string"},
                    **{
                        k: {"type": "integer", "minimum": 0}
                        for k in ("done", "failed", "cancelled", "attempts", "keys_expired", "job_batches", "batches")
                    },
                    "seconds": {"type": ["number", "null"]},
                },
            },
        },
    },
    "PruneResult": {
        "type": "object",
        "required": ["done", "failed", "cancelled", "dry_run", "finished"],
        "properties": {
            **{
                k: {"type": "integer", "minimum": 0}
                for k in (
                    "done",
                    "failed",
                    "cancelled",
                    "attempts",
                    "results",
                    "keys_expired",
                    "job_batches",
                    "batches",
                )
            },
            "seconds": {"type": "number"},
            "dry_run": {"type": "boolean"},
            "finished": {"type": "boolean"},
            "cutoffs": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "checks"],
        "properties": {
            "status": {"enum": ["ok", "warning", "problem", "error"]},
            "checks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "verdict", "detail"],
                    "properties": {
                        "name": {"type": "string"},
                        "verdict": {"enum": ["ok", "warning", "problem"]},
                        "detail": {"type": "string"},
                        "advice": {"type": ["string", "null"]},
                    },
                },
            },
            "error": {"type": ["string", "null"]},
            "replicas": {
                "type": "array",
                "description": "each replica of JOBQUEUE_REPLICA_URLS, read fresh",
                "items": {
                    "type": "object",
                    "required": [
                        "address",
                        "reachable",
                        "replica",
                        "seconds_behind",
                        "io_running",
                        "sql_running",
                        "detail",
                    ],
                    "properties": {
                        "address": {"type": "string", "description": "host:port"},
                        "reachable": {"type": "boolean"},
                        "replica": {
                            "type": ["boolean", "null"],
                            "description": "false: it replicates from nobody; null: unknown",
                        },
                        "seconds_behind": {
                            "type": ["integer", "null"],
                            "description": "Seconds_Behind_Master; null when replication "
                            "is not running or the server did not answer",
                        },
                        "io_running": {"type": ["string", "null"]},
                        "sql_running": {"type": ["string", "null"]},
                        "detail": {"type": "string"},
                    },
                },
            },
        },
    },
}


# One job (not in an array) may also wait for others (repository/dependencies.py).
SCHEMAS["NewSingleJob"] = {
    **SCHEMAS["NewJob"],
    "properties": {
        **SCHEMAS["NewJob"]["properties"],
        "after": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 80},
            "description": "task_keys of existing jobs this one waits for (blocked until all are done); "
            "an unknown key or a cycle: 422",
        },
        "on_parent_failure": {
            "enum": ["cancel", "run"],
            "description": "a parent failed or cancelled: cancel this job (default) or run it",
        },
        "batch": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "pattern": TASK_KEY_PATTERN,
            "description": "the key of an open batch this job is a member of (unknown: 404; closed: 409)",
        },
    },
}

_CALLBACK = {
    "type": "object",
    "required": ["task", "task_key", "job_id", "status"],
    "properties": {
        "task": {"type": "string"},
        "task_key": {"type": "string"},
        "job_id": {"type": ["integer", "null"], "description": "null until it fires (once)"},
        "status": {"type": ["string", "null"]},
    },
}
SCHEMAS["Batch"] = {
    "type": "object",
    "required": ["key", "state", "total", "done", "failed", "cancelled", "pending", "callbacks"],
    "properties": {
        "key": {"type": "string"},
        "state": {"enum": ["open", "closed", "finished"]},
        **{n: {"type": "integer", "minimum": 0} for n in ("total", "done", "failed", "cancelled", "pending")},
        "callbacks": {
            "type": "object",
            "properties": {f"on_{kind}": _CALLBACK for kind in ("success", "failure", "complete")},
            "additionalProperties": False,
        },
        "payload": {},
        "created_at": {"type": ["string", "null"]},
        "closed_at": {"type": ["string", "null"]},
        "finished_at": {"type": ["string", "null"]},
        "created": {"type": "boolean"},
    },
}
SCHEMAS["NewBatch"] = {
    "type": "object",
    "required": ["key"],
    "properties": {
        "key": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": TASK_KEY_PATTERN},
        **{
            f"on_{kind}": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": 100,
                "pattern": "^[!-~](?:[ -~]*[!-~])?(?![\\s\\S])",
                "description": "a task name: printable ASCII, no space at either end",
            }
            for kind in ("success", "failure", "complete")
        },
        "payload": {"type": ["object", "null"]},
    },
    "additionalProperties": False,
}
BATCH_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 64},
}
NO_BATCH = _error("no batch has that key")
PATHS["/api/batches"] = {
    "post": {
        "summary": "Open a batch (idempotent by key: a known key answers the batch as it was opened, 200)",
        "operationId": "open_batch",
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("NewBatch")}}},
        "responses": {
            "201": _json(_ref("Batch"), "opened"),
            "200": _json(_ref("Batch"), "a known key: the existing batch, `created: false`"),
            "400": BAD_BODY,
            "401": UNAUTHORIZED,
            "403": FORBIDDEN,
            "413": TOO_LARGE,
            "422": INVALID_FIELD,
            "503": UNAVAILABLE,
        },
    }
}
PATHS["/api/batches/{key}/close"] = {
    "post": {
        "summary": "Close a batch: no more members; its callbacks fire once every member has finished",
        "operationId": "close_batch",
        "parameters": [BATCH_KEY],
        "responses": {
            "200": _json(_ref("Batch"), "closed (closing a closed batch changes nothing)"),
            "401": UNAUTHORIZED,
            "403": FORBIDDEN,
            "404": NO_BATCH,
            "422": INVALID_FIELD,
            "503": UNAVAILABLE,
        },
    }
}
PATHS["/api/batches/{key}"] = {
    "get": {
        "summary": "A batch: its state, counts and callbacks",
        "operationId": "show_batch",
        "parameters": [BATCH_KEY],
        "responses": {
            "200": _json(_ref("Batch"), "the batch"),
            "401": UNAUTHORIZED,
            "404": NO_BATCH,
            "422": INVALID_FIELD,
            "503": UNAVAILABLE,
        },
    }
}


def _for_tasks(schema: dict[str, Any], task_names: list[str], keyed: dict[str, str]) -> dict[str, Any]:
    """`schema` (a body naming a task) with the registry's task names, and for each task with a
    concurrency limit the payload field it is keyed by (a string or a number; a job without it
    could not be placed under its limit)."""
    out = {
        **schema,
        "properties": {**schema["properties"], "task": {**schema["properties"]["task"], "enum": task_names}},
    }
    conditions = [
        {
            "if": {"properties": {"task": {"const": name}}, "required": ["task"]},
            "then": {
                "required": ["payload"],
                "properties": {
                    "payload": {
                        "type": "object",
                        "required": [field],
                        "properties": {field: {"type": ["string", "number"]}},
                    }
                },
            },
        }
        for name, field in sorted(keyed.items())
    ]
    if conditions:
        out["allOf"] = conditions
    return out


def document(task_names: list[str], keyed: dict[str, str] | None = None) -> dict[str, Any]:
    """The document for an app whose registry holds `task_names` (the enqueue body lists them);
    `keyed`: task name -> the payload field of its concurrency key."""
    keyed = keyed or {}
    schemas = {
        **SCHEMAS,
        "NewJob": _for_tasks(SCHEMAS["NewJob"], task_names, keyed),
        "NewSingleJob": _for_tasks(SCHEMAS["NewSingleJob"], task_names, keyed),
        "NewRecurring": _for_tasks(SCHEMAS["NewRecurring"], task_names, keyed),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jobqueue",
            "version": "1",
            "description": "The job queue's JSON API. Bearer tokens come from JOBQUEUE_API_TOKENS "
            "(`name:role:token`); admin tokens act, viewer tokens read. Session cookies are "
            "not accepted here.",
        },
        "paths": PATHS,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
