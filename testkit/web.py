"""Test users, API tokens and the settings that give a web app or a gunicorn server them, plus
`AuthActions` (after flaskr's): log a Flask test client in and out, and send what a browser or an
API client sends."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request

from werkzeug.security import generate_password_hash

ADMIN_PASSWORD = "admin-password-1"
VIEWER_PASSWORD = "viewer-password-1"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
VIEWER_TOKEN = "viewer-token-0123456789abcdef"
_HASHES: dict[str, str] = {}


def users_setting() -> str:
    """JOBQUEUE_USERS for two users: alice (admin) and victor (viewer)."""
    if not _HASHES:
        _HASHES["admin"] = generate_password_hash(ADMIN_PASSWORD)
        _HASHES["viewer"] = generate_password_hash(VIEWER_PASSWORD)
    return f"alice:admin:{_HASHES['admin']};victor:viewer:{_HASHES['viewer']}"


def tokens_setting() -> str:
    return f"ops:admin:{ADMIN_TOKEN};grafana:viewer:{VIEWER_TOKEN}"


def app_config(url: str, **extra) -> dict:
    """create_app(test_config) for a test app on `url` with no embedded workers."""
    return {
        "DATABASE_URL": url,
        "SECRET_KEY": "test-secret",
        "USERS": users_setting(),
        "API_TOKENS": tokens_setting(),
        "EMBEDDED_WORKERS": 0,
        "SECURE_COOKIES": "1",
        "TESTING": True,
        # Tests write through the repository and read the pages at once: no shared counts.
        "COUNTS_CACHE_SECONDS": 0,
        **extra,
    }


def server_env(url: str) -> dict[str, str]:
    """The environment of a gunicorn server under test (see procs.GunicornServer)."""
    return {
        "JOBQUEUE_USERS": users_setting(),
        "JOBQUEUE_SECRET_KEY": "s3cret-for-tests",
        "JOBQUEUE_API_TOKENS": tokens_setting(),
        "JOBQUEUE_LEASE_SECONDS": "10",
        "JOBQUEUE_GRACE_SECONDS": "1",
        "JOBQUEUE_COUNTS_CACHE_SECONDS": "0",
    }


def api_post(base: str, path: str, body, token: str = ADMIN_TOKEN) -> dict:
    """POST JSON to a running server with a bearer token; the decoded answer."""
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def csrf_token(client) -> str:
    page = client.get("/login").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


class AuthActions:
    """A Flask test client's session: log in as a test user, log out, and POST with the CSRF
    token the way the dashboard's HTMX requests do."""

    PASSWORDS = {"alice": ADMIN_PASSWORD, "victor": VIEWER_PASSWORD}

    def __init__(self, client):
        self.client = client
        self.token: str | None = None

    def login(self, user: str = "alice", password: str | None = None, **kw):
        response = self.client.post(
            "/login",
            data={
                "username": user,
                "password": self.PASSWORDS.get(user, "") if password is None else password,
                "csrf_token": csrf_token(self.client),
            },
            **kw,
        )
        self.token = csrf_token(self.client)
        return response

    def logout(self):
        return self.client.post("/logout", data={"csrf_token": self.token or csrf_token(self.client)})

    def post(self, path: str, data: dict | None = None, htmx: bool = True, **kw):
        headers = {"X-CSRFToken": self.token or csrf_token(self.client), **kw.pop("headers", {})}
        if htmx:
            headers["HX-Request"] = "true"
        return self.client.post(path, data=data or {}, headers=headers, **kw)

    def api(self, method: str, path: str, token: str = ADMIN_TOKEN, **kw):
        return self.client.open(
            path, method=method, headers={"Authorization": f"Bearer {token}", **kw.pop("headers", {})}, **kw
        )


@contextlib.contextmanager
def signed_in_app(url: str, **extra):
    """create_app on `url` (app_config's settings plus `extra`) and a test client signed in as the
    admin with its CSRF token at `client.token`; every engine the app made is disposed after."""
    from jobqueue import create_app

    app = create_app(app_config(url, **extra))
    client = app.test_client()
    assert login(client).status_code == 302
    client.token = csrf_token(client)
    try:
        yield app, client
    finally:
        ext = app.extensions["jobqueue"]
        ext.engine.dispose()
        if ext.read_engine is not None:
            ext.read_engine.dispose()
        if ext.replicas is not None:
            ext.replicas.dispose()


def login(client, user: str = "alice", password: str = ADMIN_PASSWORD):
    return client.post("/login", data={"username": user, "password": password, "csrf_token": csrf_token(client)})


def post(client, path: str, data: dict | None = None, htmx: bool = True, **kw):
    """POST a dashboard form as HTMX does, with the CSRF token of a client from the `client` or
    `viewer` fixture."""
    headers = {"X-CSRFToken": client.token, **kw.pop("headers", {})}
    if htmx:
        headers["HX-Request"] = "true"
    return client.post(path, data=data or {}, headers=headers, **kw)


def api(client, method: str, path: str, token: str = ADMIN_TOKEN, **kw):
    return client.open(path, method=method, headers={"Authorization": f"Bearer {token}", **kw.pop("headers", {})}, **kw)


class WebClient:
    """A browser's requests to a running server, without the browser: one cookie jar, no
    redirects followed, and optionally a source address of its own (127.0.0.3, say: the whole
    127/8 is local), so that a server sees several clients."""

    def __init__(self, base: str, source: str | None = None, ssl_context=None):
        import urllib.parse

        parts = urllib.parse.urlsplit(base)
        self.host, self.port, self.https = parts.hostname, parts.port, parts.scheme == "https"
        self.source = source
        self.ssl_context = ssl_context
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 30
    ):
        """(status, headers, text)."""
        import http.client

        source = (self.source, 0) if self.source else None
        if self.https:
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, source_address=source, context=self.ssl_context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout, source_address=source)
        try:
            sent = dict(headers or {})
            if self.cookies:
                sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
            for header, value in response.getheaders():
                if header.lower() == "set-cookie":
                    name, _, rest = value.partition("=")
                    cookie_value = rest.split(";", 1)[0]
                    if cookie_value:
                        self.cookies[name] = cookie_value
                    else:
                        self.cookies.pop(name, None)
            return response.status, {k.lower(): v for k, v in response.getheaders()}, text
        finally:
            conn.close()

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict[str, str], **kw):
        import urllib.parse

        return self.request(
            "POST",
            path,
            body=urllib.parse.urlencode(form).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded", **kw.pop("headers", {})},
            **kw,
        )

    def csrf_token(self, path: str = "/login") -> str:
        return re.search(r'name="csrf_token" value="([^"]+)"', self.get(path)[2]).group(1)

    def login(self, user: str = "alice", password: str = ADMIN_PASSWORD, query: str = ""):
        """POST /login (`query` as sent, say "?next=/%09/x"): (status, headers, text)."""
        token = self.csrf_token()
        return self.post("/login" + query, {"username": user, "password": password, "csrf_token": token})
