"""Who may look and who may act: session login for the dashboard, bearer tokens for the API.

Closed by default: every route except the login page, static files and /healthz needs a user.
Roles: `admin` acts (requeue, fail), `viewer` only looks.
"""

from __future__ import annotations

import functools
import hmac
import secrets
import threading
import time
import urllib.parse
from collections import defaultdict, deque

from flask import (Blueprint, abort, current_app, flash, g, jsonify, redirect, render_template, request,
                   session, url_for)
from werkzeug.security import check_password_hash, generate_password_hash

from .config import ApiToken, User

bp = Blueprint("auth", __name__)

LOGIN_WINDOW_SECONDS = 300
LOGIN_MAX_FAILURES = 5


@functools.cache
def _dummy_hash() -> str:
    # Checked when the user name is unknown, so that a wrong name costs as much time as a wrong
    # password (no user enumeration by timing).
    return generate_password_hash(secrets.token_hex(16))


class LoginThrottle:
    """At most LOGIN_MAX_FAILURES failed logins per client address and per user name in a
    sliding window, per web process."""

    def __init__(self) -> None:
        self._failures: dict[str, deque] = defaultdict(deque)
        self._lock = threading.Lock()

    def retry_after(self, *keys: str) -> int:
        now = time.monotonic()
        with self._lock:
            waits = []
            for key in keys:
                q = self._failures[key]
                while q and now - q[0] > LOGIN_WINDOW_SECONDS:
                    q.popleft()
                if len(q) >= LOGIN_MAX_FAILURES:
                    waits.append(int(LOGIN_WINDOW_SECONDS - (now - q[0])) + 1)
            return max(waits, default=0)

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._failures[key].append(now)

    def succeeded(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)


def settings():
    return current_app.extensions["jobqueue"].settings


def current_user() -> User | None:
    name = session.get("user")
    return settings().users.get(name) if name else None


def login_required(view):
    """Pages: a signed-in user, or a redirect to the login page."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        user = current_user()
        if user is None:
            if request.headers.get("HX-Request"):
                # An expired session during polling: make HTMX load the login page as a whole.
                response = current_app.make_response(("", 401))
                response.headers["HX-Redirect"] = url_for("auth.login", next=request.path)
                return response
            return redirect(url_for("auth.login", next=request.full_path if request.query_string else request.path))
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
                return _api_error(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
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
    given = header[len("Bearer "):].strip().encode()
    found = None
    for token in settings().api_tokens:
        if hmac.compare_digest(given, token.token.encode()):
            found = token
    return found


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
    fallback = url_for("dashboard.overview")
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
    throttle: LoginThrottle = current_app.extensions["jobqueue"].login_throttle
    if request.method == "POST":
        name = request.form.get("username", "")[:100]
        password = request.form.get("password", "")[:1000]
        keys = (f"addr:{request.remote_addr}", f"user:{name}")
        wait = throttle.retry_after(*keys)
        if wait:
            current_app.logger.warning("event=login_throttled user=%r addr=%s", name, request.remote_addr)
            response = current_app.make_response(
                (render_template("auth/login.html", error=f"Too many failed attempts; try again in {wait} s."), 429))
            response.headers["Retry-After"] = str(wait)
            return response
        user = settings().users.get(name)
        if check_password_hash(user.password_hash if user else _dummy_hash(), password) and user:
            throttle.succeeded(*keys)
            session.clear()
            session["user"] = user.name
            session.permanent = True
            current_app.logger.info("event=login user=%s addr=%s", user.name, request.remote_addr)
            return redirect(safe_next(request.args.get("next")))
        throttle.failed(*keys)
        current_app.logger.warning("event=login_failed user=%r addr=%s", name, request.remote_addr)
        return render_template("auth/login.html", error="Wrong user name or password."), 401
    return render_template("auth/login.html", error=None)


@bp.post("/logout")
def logout():
    session.clear()
    flash("Signed out.")
    return redirect(url_for("auth.login"))
