"""Settings for the web process, from the environment (or a test's dict)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from werkzeug.security import generate_password_hash

ROLES = ("admin", "viewer")
# Names of the JOBQUEUE_* settings (without the prefix); create_app(test_config) takes them too.
SETTING_KEYS = frozenset({"DATABASE_URL", "SECRET_KEY", "USERS", "API_TOKENS", "DEV", "DEV_PASSWORD",
                          "EMBEDDED_WORKERS", "EMBEDDED_QUEUES", "LEASE_SECONDS", "GRACE_SECONDS", "SECURE_COOKIES",
                          "TASKS"})


class ConfigError(RuntimeError):
    """The web interface cannot start safely with this configuration."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str

    @property
    def can_act(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class ApiToken:
    name: str
    role: str
    token: str


@dataclass(frozen=True)
class WebSettings:
    database_url: str | None
    secret_key: str
    users: dict[str, User]
    api_tokens: tuple[ApiToken, ...]
    dev: bool
    embedded_workers: int
    embedded_queues: tuple[str, ...] | None
    lease_seconds: float
    grace_seconds: float
    secure_cookies: bool
    dev_password: str | None = field(default=None, repr=False)


def parse_users(text: str) -> dict[str, User]:
    """`name:role:hash` entries separated by newlines or ';' (hashes from `jobqueue hash-password`)."""
    users = {}
    for entry in filter(None, (e.strip() for e in text.replace("\n", ";").split(";"))):
        try:
            name, role, password_hash = entry.split(":", 2)
        except ValueError:
            raise ConfigError(f"JOBQUEUE_USERS entry {entry.split(':', 1)[0]!r} is not name:role:hash") from None
        if role not in ROLES:
            raise ConfigError(f"user {name!r} has role {role!r}; roles are {', '.join(ROLES)}")
        if not name or not password_hash:
            raise ConfigError("JOBQUEUE_USERS entries need a name and a password hash")
        users[name] = User(name, role, password_hash)
    return users


def parse_tokens(text: str) -> tuple[ApiToken, ...]:
    """`name:role:token` entries separated by newlines or ';'. Tokens of at least 24 characters."""
    tokens = []
    for entry in filter(None, (e.strip() for e in text.replace("\n", ";").split(";"))):
        try:
            name, role, token = entry.split(":", 2)
        except ValueError:
            raise ConfigError("JOBQUEUE_API_TOKENS entries are name:role:token") from None
        if role not in ROLES:
            raise ConfigError(f"API token {name!r} has role {role!r}; roles are {', '.join(ROLES)}")
        if len(token) < 24:
            raise ConfigError(f"API token {name!r} is too short (at least 24 characters)")
        tokens.append(ApiToken(name, role, token))
    return tuple(tokens)


def load_settings(overrides: dict | None = None) -> WebSettings:
    o = dict(overrides or {})

    def get(key: str, default: str | None = None) -> str | None:
        if key in o:
            value = o[key]
            return None if value is None else str(value)
        return os.environ.get("JOBQUEUE_" + key, default)

    dev = (get("DEV", "0") or "0").lower() in ("1", "true", "yes", "on")
    users = parse_users(get("USERS", "") or "")
    dev_password = None
    if not users:
        if not dev:
            raise ConfigError(
                "no users configured: the dashboard is closed by default. Set JOBQUEUE_USERS to "
                "'name:admin:<hash>' (make a hash with `jobqueue hash-password`), or run "
                "`jobqueue serve --dev` for a development server on localhost only.")
        # Development mode on localhost: one admin whose password is given (jobqueue serve
        # --dev passes the same one to every gunicorn worker) or made up and logged.
        dev_password = get("DEV_PASSWORD") or secrets.token_urlsafe(12)
        users = {"admin": User("admin", "admin", generate_password_hash(dev_password))}
    secret = get("SECRET_KEY")
    if not secret:
        if not dev:
            raise ConfigError("JOBQUEUE_SECRET_KEY is not set: sessions need a secret shared by every web "
                              "process (for example: python -c 'import secrets; print(secrets.token_hex(32))')")
        secret = secrets.token_hex(32)
    queues = get("EMBEDDED_QUEUES")
    try:
        embedded = int(get("EMBEDDED_WORKERS", "2") or 0)
        lease = float(get("LEASE_SECONDS", "60") or 60)
        grace = float(get("GRACE_SECONDS", "20") or 20)
    except ValueError as exc:
        raise ConfigError(f"bad number in configuration: {exc}") from None
    if embedded < 0 or embedded > 256:
        raise ConfigError("JOBQUEUE_EMBEDDED_WORKERS must be 0..256")
    secure_default = "0" if dev else "1"
    return WebSettings(
        database_url=get("DATABASE_URL"),
        secret_key=secret,
        users=users,
        api_tokens=parse_tokens(get("API_TOKENS", "") or ""),
        dev=dev,
        embedded_workers=embedded,
        embedded_queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
        lease_seconds=lease,
        grace_seconds=grace,
        secure_cookies=(get("SECURE_COOKIES", secure_default) or secure_default).lower() in ("1", "true", "yes", "on"),
        dev_password=dev_password,
    )
