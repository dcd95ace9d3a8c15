"""Headers on every answer, CSRF on every form, development mode's localhost-only rule, and
refusing queue writes on a server that cannot take them.

`scope` is the app (standalone: everything it serves is ours) or the queue's blueprint (mounted
in a host app by init_dashboard: only the queue's own requests are touched)."""

from __future__ import annotations

import ipaddress
import logging

from flask import Blueprint, Flask, current_app, g, jsonify, render_template, request
from flask_wtf.csrf import CSRFProtect, generate_csrf

from ..core.logs import event
from .state import extension

log = logging.getLogger("jobqueue.web")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)

# Flask-WTF's checker, applied by our own hook to the queue's requests only (CSRFProtect.init_app
# would apply it to every view of a host app). The API takes bearer tokens only (never the
# session cookie), which is what keeps it out of reach of cross-site requests.
csrf = CSRFProtect()
CSRF_DEFAULTS = {
    "WTF_CSRF_ENABLED": True,
    "WTF_CSRF_METHODS": {"POST", "PUT", "PATCH", "DELETE"},
    "WTF_CSRF_FIELD_NAME": "csrf_token",
    "WTF_CSRF_HEADERS": ["X-CSRFToken", "X-CSRF-Token"],
    "WTF_CSRF_TIME_LIMIT": 3600,
    "WTF_CSRF_SSL_STRICT": True,
}


def wants_json() -> bool:
    return (
        request.path.startswith(extension().url_prefix + "/api/") or request.accept_mimetypes.best == "application/json"
    )


def init_app(app: Flask, scope: Flask | Blueprint) -> None:
    from . import api

    csrf.exempt(api.bp)
    for key, value in CSRF_DEFAULTS.items():  # Flask-WTF's own defaults; a host's settings stay
        app.config.setdefault(key, value)
    host_csrf = app.extensions.get("csrf")
    if isinstance(host_csrf, CSRFProtect):
        host_csrf.exempt(api.bp)  # the host's CSRFProtect would refuse the API's POSTs

    @scope.before_request
    def _check_csrf():
        # g.csrf_valid: the host's own CSRFProtect has checked this request already.
        if current_app.config["WTF_CSRF_ENABLED"] and not g.get("csrf_valid"):
            csrf.protect(apply_exemptions=True)

    @scope.context_processor
    def _csrf_token():
        return {"csrf_token": generate_csrf}

    ext = app.extensions["jobqueue"]
    settings = ext.settings
    if settings.dev:
        event(log, logging.WARNING, "dev_mode", detail="development mode: localhost only")

        @scope.before_request
        def _localhost_only():
            try:
                loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                return render_template(
                    "jobqueue/error.html", code=403, message="Development mode serves localhost only."
                ), 403

    @scope.before_request
    def _refuse_writes_on_an_unsafe_server():
        if request.method == "POST" and request.endpoint not in ("jobqueue.auth.login", "jobqueue.auth.logout"):
            reason = extension().write_refusal()
            if reason:
                event(log, logging.ERROR, "write_refused", path=request.path, reason=reason)
                message = f"This database does not take queue writes: {reason}"
                if wants_json():
                    return jsonify({"error": message}), 503
                return render_template("jobqueue/error.html", code=503, message=message), 503

    # Secure cookies mean the site is served over HTTPS: tell browsers to use nothing else (they
    # ignore the header on plain HTTP, so a misconfigured site is not locked out by it). Mounted,
    # the site and its cookies are the host's, and so is this decision.
    hsts = "max-age=31536000" if settings.secure_cookies and ext.access is None else None

    @scope.after_request
    def _headers(response):
        if hsts:
            response.headers.setdefault("Strict-Transport-Security", hsts)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if response.mimetype == "text/html":
            response.headers.setdefault("Cache-Control", "no-store")
        return response
