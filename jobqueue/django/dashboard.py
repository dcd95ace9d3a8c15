"""The queue's dashboard (the Flask app, jobqueue.web) inside a Django project, behind Django's
own login:

    urlpatterns = [path("admin/", admin.site.urls), path("jobs-admin/", include("jobqueue.django.urls"))]

A signed-out visitor is sent to the login page (302, LOGIN_URL: the admin's by default), a
signed-in user who is not staff is refused (403). Staff look ("viewer"); superusers act
("admin"); the audit log names the Django user. The Django view hands the request to the Flask
app as a WSGI call: Flask's own CSRF check guards the dashboard's forms (so Django's is waived
for this view only), and the JSON API under the prefix takes its bearer tokens, as mounted in
any host (docs/python-api.md, init_dashboard).
"""

from __future__ import annotations

import hashlib
import io
import threading
from http.cookies import SimpleCookie
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.csrf import csrf_exempt

from .connection import database_url

USER = "jobqueue.django.user"
_apps: dict[str, Any] = {}
_lock = threading.Lock()


def role(user) -> str | None:
    """Who may do what: superusers act, other staff look, everyone else is refused."""
    if not (user.is_active and user.is_staff):
        return None
    return "admin" if user.is_superuser else "viewer"


def flask_app(prefix: str):
    """The Flask app serving the dashboard under `prefix`, one per prefix and process."""
    with _lock:
        if prefix not in _apps:
            from flask import Flask

            from ..web import init_dashboard
            from .framework import task_backends

            options = getattr(settings, "JOBQUEUE", {})
            alias = task_backends[options.get("BACKEND", "default")].database
            app = Flask("jobqueue.django")
            app.config.update(
                # Its own session cookie (the CSRF token), signed with a key derived from Django's.
                SECRET_KEY=hashlib.sha256(b"jobqueue.django:" + settings.SECRET_KEY.encode()).hexdigest(),
                SESSION_COOKIE_NAME="jobqueue_session",
                SESSION_COOKIE_PATH=prefix,
                SESSION_COOKIE_HTTPONLY=True,
                SESSION_COOKIE_SAMESITE="Lax",
                SESSION_COOKIE_SECURE=settings.SESSION_COOKIE_SECURE,
                JOBQUEUE_DATABASE_URL=database_url(alias),
                JOBQUEUE_EMBEDDED_WORKERS=0,
                **{f"JOBQUEUE_{k}": v for k, v in options.items() if k != "BACKEND"},
            )
            init_dashboard(
                app,
                prefix,
                authorize=lambda request: role(request.environ[USER]),
                user_name=lambda request: request.environ[USER].get_username(),
            )
            _apps[prefix] = app
        return _apps[prefix]


@csrf_exempt
def dashboard(request: HttpRequest, rest: str = "") -> HttpResponse:
    user = request.user
    prefix = request.path[: len(request.path) - len(rest)].rstrip("/")
    if not rest.startswith("api/"):  # the API takes bearer tokens, never the session
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if role(user) is None:
            return HttpResponseForbidden("Staff only.")
    environ = dict(request.environ)
    environ.update(
        {
            USER: user,
            "SCRIPT_NAME": request.META.get("SCRIPT_NAME", ""),
            "PATH_INFO": request.path_info,
            "wsgi.input": io.BytesIO(request.body),
            "CONTENT_LENGTH": str(len(request.body)),
        }
    )
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
        answer["status"], answer["headers"] = int(status.split(" ", 1)[0]), headers

    chunks = flask_app(prefix)(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    response = HttpResponse(body, status=answer["status"])
    for name, value in answer["headers"]:
        if name.lower() == "set-cookie":
            _add_cookie(response, value)
        else:
            response[name] = value
    return response


def _add_cookie(response: HttpResponse, header: str) -> None:
    cookie = SimpleCookie()
    cookie.load(header)
    for key, morsel in cookie.items():
        response.cookies[key] = morsel
