"""What the dashboard's views share: the blueprint, the request's filters, who acts, HTMX."""

from __future__ import annotations

from datetime import datetime

from flask import Blueprint, abort, g, request

from ...core.errors import ValidationError
from ...core.models import Job
from ...core.repository.operator import JobFilter
from ...core.validation import JobQuery, job_query

bp = Blueprint("dashboard", __name__)

PAGE_SIZE = 50
MATCH_COUNT_CAP = 10_000  # counts of matches stop here ("10,000+"): bounded reads at any table size
MOVING = ("ready", "scheduled", "running", "blocked")  # rows in these states are refreshed live
EPOCH = datetime(1970, 1, 1)


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def actor() -> str:
    return f"web:{g.user.name}"


# --- request parsing -----------------------------------------------------------------------------


def whole_number(raw: str) -> int | None:
    # ASCII digits only: str.isdigit() also says yes to "²" and "١", which int() refuses (or, for
    # other scripts, reads as a number nobody typed). At most 18 digits: a BIGINT always holds it.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def int_arg(source, name: str) -> int | None:
    raw = (source.get(name) or "").strip()
    if not raw:
        return None
    value = whole_number(raw)
    if value is None:
        abort(400, description=f"{name} must be a positive whole number")
    return value


def yes_no(source, name: str) -> bool:
    value = source.get(name, "")
    if value not in ("", "yes", "no"):
        abort(400, description=f"{name} must be 'yes' or 'no'")
    return value == "yes"


def parse_query(source, *, default_limit: int = PAGE_SIZE) -> JobQuery:
    """The job filters and keyset position of a request (query arguments or a form); 400 on bad
    input, before anything is read or written."""
    try:
        return job_query(source, default_limit=default_limit, max_limit=PAGE_SIZE)
    except ValidationError as exc:
        abort(400, description=str(exc))


def parse_filter(source) -> JobFilter:
    return parse_query(source).job_filter


def filter_args(f: JobFilter) -> dict[str, str]:
    return f.args()


def moving(job: Job) -> bool:
    return job.status.value in MOVING


def row_version(job: Job) -> str:
    """Changes whenever the row does (every write sets updated_at), for the live refresh."""
    stamp = int((job.updated_at - EPOCH).total_seconds() * 1_000_000) if job.updated_at else 0
    return f"{stamp:x}.{job.status.value[:2]}{job.attempts}"


@bp.app_template_global("row_version")
def _row_version(job: Job) -> str:
    return row_version(job)


def require_confirm() -> None:
    if request.form.get("confirm") != "yes":
        abort(400, description="this action needs confirmation")
