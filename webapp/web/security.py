"""Headers on every answer, development mode's localhost-only rule, and refusing queue writes on
a server that cannot take them."""

from __future__ import annotations

import ipaddress
import logging

from flask import Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFProtect

from .state import extension
from ..core.logs import event

log = logging.getLogger("jobqueue.web")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")


def wants_json() -> bool:
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def init_app(app: Flask) -> None:
    from . import api

    # Every POST of the dashboard needs a CSRF token. The API takes bearer tokens only (never the
    # session cookie), which is what keeps it out of reach of cross-site requests.
    CSRFProtect(app).exempt(api.bp)
    settings = app.extensions["jobqueue"].settings
    if settings.dev:
        event(log, logging.WARNING, "dev_mode", detail="development mode: localhost only")

        @app.before_request
        def _localhost_only():
            try:
                loopback = ipaddress.ip_address(request.remote_addr or "").is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                return render_template("error.html", code=403,
                                       message="Development mode serves localhost only."), 403

    @app.before_request
    def _refuse_writes_on_an_unsafe_server():
        if request.method == "POST" and request.endpoint not in ("auth.login", "auth.logout"):
            reason = extension().write_refusal()
            if reason:
                event(log, logging.ERROR, "write_refused", path=request.path, reason=reason)
                message = f"This database does not take queue writes: {reason}"
                if wants_json():
                    return jsonify({"error": message}), 503
                return render_template("error.html", code=503, message=message), 503

    # Secure cookies mean the site is served over HTTPS: tell browsers to use nothing else (they
    # ignore the header on plain HTTP, so a misconfigured site is not locked out by it).
    hsts = "max-age=31536000" if settings.secure_cookies else None

    @app.after_request
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
