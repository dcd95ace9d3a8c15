"""Who may look and who may act: session login for the dashboard, bearer tokens for the API.

Closed by default: every route except the login page, static files and /healthz needs a user.
Roles: `admin` acts (requeue, fail), `viewer` only looks. Mounted in a host app
(init_dashboard), the host's login decides instead (HostAccess); the API's tokens are the same.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import math
import secrets
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from flask import Blueprint, abort, current_app, flash, g, jsonify, redirect, render_template, request, session, url_for
from werkzeug.security import check_password_hash, generate_password_hash

from ..core import metrics, repository
from ..core.logs import event
from ..core.repository.sessions import ThrottleKey, ThrottleRule
from .config import ROLES, ApiToken, ConfigError, User, digest
from .state import db, extension

bp = Blueprint("auth", __name__)
log = logging.getLogger("jobqueue.web.auth")

# Throttle the guesser, not the owner: by (address, user name) and by address, never by user name
# alone (that would let anyone lock an account out from anywhere). An address gets more free
# attempts than a pair: several people may sign in from behind one NAT.
ADDRESS_USER_RULE = ThrottleRule("address_user", free=5, first_delay=2.0, max_delay=900.0, forget=900.0)
ADDRESS_RULE = ThrottleRule("address", free=20, first_delay=2.0, max_delay=900.0, forget=900.0)
TOUCH_EVERY_SECONDS = 60.0  # a session's last_seen_at is written at most this often (idle limit: an hour)
PRUNE_EVERY_SECONDS = 60.0


@functools.cache
def _dummy_hash() -> str:
    # Checked when the user name is unknown, so that a wrong name costs as much time as a wrong
    # password (no user enumeration by timing).
    return generate_password_hash(secrets.token_hex(16))


def settings():
    return current_app.extensions["jobqueue"].settings


def credential_of(user: User) -> str:
    """What a session remembers of the user's password (config.User.credential)."""
    return user.credential


def client_address() -> str:
    """The client's address for the throttle; IPv6 clients by their /64, which one host holds as
    easily as one address."""
    raw = request.remote_addr or "unknown"
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return raw[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def throttle_keys(address: str, user_name: str) -> list[ThrottleKey]:
    # The address first: while it is blocked no (address, user) row is made (login_attempt).
    return [
        ThrottleKey(digest("address", address), ADDRESS_RULE),
        ThrottleKey(digest("address_user", address, user_name), ADDRESS_USER_RULE),
    ]


def _shown(name: str) -> str:
    # A user name someone typed goes into log lines: keep it on one line.
    return name if name.isprintable() else ascii(name)[1:-1]


# --- sessions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostAccess:
    """The host app's answer to "who is this?" (init_dashboard): `authorize(request)` gives None,
    "viewer" or "admin"; `user_name(request)` the name the audit log records."""

    authorize: Callable[..., str | None]
    user_name: Callable[..., str]

    def user(self) -> User | None:
        role = self.authorize(request)
        if role is None:
            return None
        if role not in ROLES:
            raise ConfigError(f"authorize() answered {role!r}; it must answer None, 'viewer' or 'admin'")
        name = self.user_name(request)
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("user_name() must answer the signed-in user's name (a non-empty string)")
        return User(_shown(name.strip())[:90], role, password_hash="")  # "web:<name>" fits the audit log


def current_user() -> User | None:
    """The signed-in user of this request, checked once per request: against web_session, or,
    mounted in a host app, by its authorize()."""
    if "jobqueue_user" not in g:
        access = extension().access
        g.jobqueue_user = access.user() if access is not None else _signed_in_user()
    return g.jobqueue_user


def _signed_in_user() -> User | None:
    name, token = session.get("user"), session.get("sid")
    if not name and not token:
        return None
    if not name or not isinstance(token, str):
        session.clear()  # a cookie from before sessions were kept on the server
        return None
    user = settings().users.get(name)
    session_id = digest("session", token)
    with db() as conn:
        state = repository.sessions.session_state(conn, session_id)
        reason = _end_reason(state, user)
        if reason is None:
            if state.idle_seconds >= TOUCH_EVERY_SECONDS:
                repository.sessions.touch_session(conn, session_id)
            return user
        if state is not None and state.ended_at is None:
            repository.sessions.end_session(conn, session_id, reason)
            metrics.SESSIONS_ENDED.labels(reason=reason).inc()
            event(log, logging.INFO, "session_ended", user=_shown(name), reason=reason)
    event(
        log,
        logging.INFO,
        "session_refused",
        user=_shown(name),
        reason=reason,
        addr=request.remote_addr,
        path=request.path,
    )
    session.clear()
    return None


def _end_reason(state: repository.sessions.SessionState | None, user: User | None) -> str | None:
    """Why this session no longer signs anyone in, or None while it is good."""
    if state is None:
        return "unknown"
    if state.ended_at is not None:
        return state.end_reason or "ended"
    if user is None or state.user_name != user.name:
        return "user_removed"
    if state.credential != credential_of(user):
        return "credential_changed"
    if state.age_seconds > settings().session_max_seconds:
        return "expired"
    if state.idle_seconds > settings().session_idle_seconds:
        return "idle"
    return None


def _maybe_prune() -> None:
    ext = extension()
    now = time.monotonic()
    if now - ext.sign_in_pruned_at < PRUNE_EVERY_SECONDS:
        return
    ext.sign_in_pruned_at = now
    with db() as conn:
        repository.sessions.prune_sign_in(
            conn, idle_seconds=settings().session_idle_seconds, max_seconds=settings().session_max_seconds
        )


def login_required(view):
    """Pages: a signed-in user, or a redirect to the login page."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        user = current_user()
        if user is None:
            if extension().access is not None:
                # Mounted: the host's authorize() said no (to send signed-out users to the host's
                # login page instead, authorize raises that redirect itself).
                abort(403, description="You have no access to the job queue's dashboard.")
            if request.headers.get("HX-Request"):
                # An expired session during polling: make HTMX load the login page as a whole.
                response = current_app.make_response(("", 401))
                response.headers["HX-Redirect"] = url_for("jobqueue.auth.login", next=request.path)
                return response
            return redirect(
                url_for("jobqueue.auth.login", next=request.full_path if request.query_string else request.path)
            )
        g.user = user
        return view(*args, **kwargs)

    return wrapped


def admin_required(view):
    """Actions: a signed-in admin; a viewer gets 403."""

    @functools.wraps(view)
    @login_required
    def wrapped(*args, **kwargs):
        if not g.user.can_act:
            abort(403, description="your role can look but not act")
        return view(*args, **kwargs)

    return wrapped


def token_required(admin: bool = False):
    """API: `Authorization: Bearer <token>` from JOBQUEUE_API_TOKENS. Session cookies are not
    accepted here, which is what keeps the API out of reach of cross-site requests."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(*args, **kwargs):
            token = bearer_token()
            if token is None:
                return _api_error(401, token_refusal(), {"WWW-Authenticate": "Bearer"})
            if admin and not token.role == "admin":
                return _api_error(403, "this token can read but not act")
            g.api_token = token
            return view(*args, **kwargs)

        return wrapped

    return decorate


def bearer_token() -> ApiToken | None:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return None
    given = header[len("Bearer ") :].strip().encode()
    found = None
    for token in settings().api_tokens:
        if hmac.compare_digest(given, token.token.encode()):
            found = token
    return found


def token_refusal() -> str:
    """Why a request has no valid token: none was sent, or the one sent matches none."""
    return (
        "invalid bearer token"
        if request.headers.get("Authorization", "").startswith("Bearer ")
        else "missing bearer token"
    )


def _api_error(status: int, message: str, headers: dict | None = None):
    response = jsonify({"error": message})
    response.status_code = status
    for k, v in (headers or {}).items():
        response.headers[k] = v
    return response


# What a browser drops from a URL before it parses it (the WHATWG URL standard): C0 controls and
# spaces at either end, tabs and newlines anywhere. It also reads a backslash as "/" in http(s) URLs.
_URL_EDGES = "".join(map(chr, range(0x21)))
_URL_DROPPED = str.maketrans("", "", "\t\n\r")
_PATH_SAFE = "/?#[]@!$&'()*+,;=:%~-._"


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site, judged after the same clean-up a
    browser applies to a Location header, or the overview. `/%09/evil.example` (a tab) is
    `//evil.example` to a browser, another site, so it is judged as that and never passed on."""
    fallback = url_for("jobqueue.dashboard.overview")
    if not target:
        return fallback
    cleaned = target.strip(_URL_EDGES).translate(_URL_DROPPED).replace("\\", "/")
    if not cleaned.startswith("/") or cleaned.startswith("//"):
        return fallback
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in cleaned):
        return fallback
    parts = urllib.parse.urlsplit(cleaned)
    if parts.scheme or parts.netloc:
        return fallback
    # Percent-encode whatever is not plain ASCII, so the header is what was judged.
    return urllib.parse.quote(cleaned, safe=_PATH_SAFE)


@bp.route("/login", methods=["GET", "POST"])
def login():
    if request.method == "GET":
        return render_template("jobqueue/auth/login.html", error=None)
    name = request.form.get("username", "")[:100]
    password = request.form.get("password", "")[:1000]
    address = client_address()
    keys = throttle_keys(address, name)
    _maybe_prune()
    with db() as conn:
        gate = repository.sessions.login_attempt(conn, keys)
    if not gate.allowed:
        wait = max(1, math.ceil(gate.wait_seconds))
        metrics.LOGINS.labels(outcome="throttled").inc()
        metrics.LOGINS_THROTTLED.labels(limit=gate.limit).inc()
        event(
            log,
            logging.WARNING,
            "login_throttled",
            user=_shown(name),
            addr=request.remote_addr,
            limit=gate.limit,
            retry_after=wait,
        )
        response = current_app.make_response(
            (
                render_template("jobqueue/auth/login.html", error=f"Too many failed attempts; try again in {wait} s."),
                429,
            )
        )
        response.headers["Retry-After"] = str(wait)
        return response
    user = settings().users.get(name)
    if check_password_hash(user.password_hash if user else _dummy_hash(), password) and user:
        token = secrets.token_urlsafe(32)
        with db() as conn:
            repository.sessions.login_succeeded(conn, keys)
            repository.sessions.start_session(
                conn,
                digest("session", token),
                user_name=user.name,
                credential=credential_of(user),
                address=request.remote_addr,
            )
        session.clear()
        session["user"] = user.name
        session["sid"] = token
        session.permanent = True
        metrics.LOGINS.labels(outcome="ok").inc()
        event(log, logging.INFO, "login", user=user.name, addr=request.remote_addr)
        return redirect(safe_next(request.args.get("next")))
    metrics.LOGINS.labels(outcome="failed").inc()
    event(log, logging.WARNING, "login_failed", user=_shown(name), addr=request.remote_addr)
    return render_template("jobqueue/auth/login.html", error="Wrong user name or password."), 401


@bp.post("/logout")
def logout():
    token = session.get("sid")
    if isinstance(token, str):
        with db() as conn:
            if repository.sessions.end_session(conn, digest("session", token), "logout"):
                metrics.SESSIONS_ENDED.labels(reason="logout").inc()
                event(log, logging.INFO, "logout", user=_shown(str(session.get("user", ""))))
    session.clear()
    flash("Signed out.")
    return redirect(url_for("jobqueue.auth.login"))


@bp.get("/sessions")
@login_required
def sessions():
    """Open sessions: your own, or (admin) everyone's, with "sign out everywhere"."""
    with db() as conn:
        rows = repository.sessions.list_sessions(
            conn,
            idle_seconds=settings().session_idle_seconds,
            max_seconds=settings().session_max_seconds,
            user_name=None if g.user.can_act else g.user.name,
        )
        now = repository.reads.database_now(conn)
    current = digest("session", session.get("sid", ""))
    return render_template(
        "jobqueue/auth/sessions.html",
        sessions=rows,
        now=now,
        current=current,
        users=sorted(settings().users),
        idle_minutes=round(settings().session_idle_seconds / 60),
        max_hours=f"{settings().session_max_seconds / 3600:g}",
    )


@bp.post("/sessions/end")
@login_required
def end_sessions():
    """Sign out everywhere: `scope=mine` (anyone: all my sessions), `scope=user` with `user`
    (admin: all of that user's), `scope=all` (admin: every session of every user)."""
    scope = request.form.get("scope", "mine")
    if scope not in ("mine", "user", "all"):
        abort(400, description="scope must be 'mine', 'user' or 'all'")
    if scope != "mine" and not g.user.can_act:
        abort(403, description="your role can end its own sessions only")
    target = g.user.name if scope == "mine" else None
    if scope == "user":
        target = request.form.get("user", "")
        if target not in settings().users:
            abort(400, description="no such user")
    with db() as conn:
        n = repository.sessions.end_sessions(conn, actor=f"web:{g.user.name}", user_name=target)
    metrics.SESSIONS_ENDED.labels(reason="signed_out_all").inc(n)
    event(log, logging.WARNING, "signed_out_everywhere", actor=g.user.name, user=target or "*", sessions=n)
    if current_user_session_ended(target):
        session.clear()
        flash(f"Signed out everywhere ({n} sessions ended).")
        return redirect(url_for("jobqueue.auth.login"))
    flash(f"{n} sessions of {target or 'every user'} ended.", "success")
    return redirect(url_for("jobqueue.auth.sessions"))


def current_user_session_ended(target: str | None) -> bool:
    return target is None or target == g.user.name
