"""The web process's settings: users, tokens and the session secret, parsed from the process's
Settings (jobqueue.core.settings reads every JOBQUEUE_* variable)."""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from dataclasses import dataclass, field

from werkzeug.security import generate_password_hash

from ..core.settings import SETTINGS, Settings, SettingsError

ROLES = ("admin", "viewer")
# Names of the JOBQUEUE_* settings (without the prefix); create_app(test_config) takes them too.
SETTING_KEYS = frozenset(s.name for s in SETTINGS)


class ConfigError(RuntimeError):
    """The web interface cannot start safely with this configuration."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str
    # What a session remembers of the password it was signed in with (auth.credential_of): it
    # changes when the password does, which ends the sessions signed in with the old one. By
    # default a digest of the configured hash. It must be the same in every process of the
    # deployment, so a password that each process hashes itself (--dev) gives its own.
    credential: str = ""

    def __post_init__(self) -> None:
        if not self.credential:
            object.__setattr__(self, "credential", digest("credential", self.password_hash))

    @property
    def can_act(self) -> bool:
        return self.role == "admin"


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ApiToken:
    name: str
    role: str
    token: str


@dataclass(frozen=True)
class WebSettings:
    core: Settings
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
    session_idle_seconds: float = 3600.0
    session_max_seconds: float = 12 * 3600.0
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


def load_settings(
    overrides: dict | None = None, *, settings: Settings | None = None, hosted: bool = False
) -> WebSettings:
    """The web process's settings, from the process's Settings (the environment) with
    `overrides` by JOBQUEUE_* name without the prefix (create_app's test_config). `hosted`: the
    dashboard is mounted in another app (init_dashboard), whose login and session secret are
    used, so no users or secret key of our own are needed."""
    o = {k: v for k, v in (overrides or {}).items() if k in SETTING_KEYS}
    try:
        base = settings or Settings.from_env()
        if o:
            base = Settings.from_env(**{**_as_overrides(base), **o})
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None
    users = parse_users(base.users or "")
    dev_password = None
    if hosted:
        users = {}
    elif not users:
        if not base.dev:
            raise ConfigError(
                "no users configured: the dashboard is closed by default. Set JOBQUEUE_USERS to "
                "'name:admin:<hash>' (make a hash with `jobqueue hash-password`), or run "
                "`jobqueue serve --dev` for a development server on localhost only."
            )
        # Development mode on localhost: one admin whose password is given (jobqueue serve
        # --dev passes the same one to every gunicorn worker) or made up and logged.
        dev_password = base.dev_password or secrets.token_urlsafe(12)
        # Each process salts its own hash; the credential comes from the password every process
        # was given, so a session made by one process holds in the others.
        users = {
            "admin": User(
                "admin",
                "admin",
                generate_password_hash(dev_password),
                credential=digest("dev-credential", dev_password),
            )
        }
    secret = base.secret_key or ""
    if not secret and not hosted:
        if not base.dev:
            raise ConfigError(
                "JOBQUEUE_SECRET_KEY is not set: sessions need a secret shared by every web "
                "process (for example: python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        secret = secrets.token_hex(32)
    return WebSettings(
        core=base,
        database_url=" ".join(base.database_urls) or None,
        secret_key=secret,
        users=users,
        api_tokens=parse_tokens(base.api_tokens or ""),
        dev=base.dev and not hosted,
        embedded_workers=base.embedded_workers,
        embedded_queues=base.embedded_queues,
        lease_seconds=base.lease_seconds,
        grace_seconds=base.grace_seconds,
        secure_cookies=base.secure_cookies if base.secure_cookies is not None else not base.dev,
        session_idle_seconds=base.session_idle_minutes * 60.0,
        session_max_seconds=base.session_max_hours * 3600.0,
        dev_password=dev_password,
    )


def _as_overrides(settings: Settings) -> dict:
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
