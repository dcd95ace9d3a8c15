"""Every `JOBQUEUE_*` setting, read in one place into one typed object.

An entry point (the `jobqueue` command, `create_app`, gunicorn's config, `JobQueue.from_env()`)
calls `Settings.from_env()` once and passes what each part needs down: the engine its URL and
lock wait, a worker its lease and grace, the web app its users and tokens. Code that is handed
no settings (a handler importing `jobqueue.core.builtin_tasks`, a test) uses `current()`, the
process's settings, read from the environment on first use.

The README's configuration table is this module's `SETTINGS` (`python -m jobqueue.core.settings`
prints it; a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "JOBQUEUE_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class SettingsError(ValueError):
    """A setting has a value the queue cannot use (names the variable)."""


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{PREFIX}{name} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def _number(kind: type, low: float | None = None, high: float | None = None) -> Callable[[str, str], Any]:
    def parse(name: str, raw: str):
        try:
            value = kind(raw.strip())
        except ValueError:
            raise SettingsError(f"{PREFIX}{name} must be {'a whole number' if kind is int else 'a number'}; "
                                f"got {raw!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise SettingsError(f"{PREFIX}{name} must be in {low:g}..{high:g}; got {raw!r}")
        return value
    return parse


def _text(name: str, raw: str) -> str | None:
    return raw.strip() or None


def _csv(name: str, raw: str) -> tuple[str, ...] | None:
    items = tuple(part.strip() for part in raw.split(",") if part.strip())
    return items or None


def _words(name: str, raw: str) -> tuple[str, ...]:
    return tuple(raw.split())


def _server_urls(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(raw.split())
    for url in urls:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme.split("+", 1)[0] not in ("mysql", "mariadb"):
            # Only the scheme is echoed: the URL may carry a password.
            raise SettingsError(f"{PREFIX}{name} takes MySQL/MariaDB server URLs separated by spaces "
                                f"(mysql+pymysql://user:pass@host:port); got one starting {scheme or url[:8]!r}")
    return urls


def _secret(name: str, raw: str) -> str | None:
    return raw or None


@dataclass(frozen=True)
class Setting:
    name: str                  # without the JOBQUEUE_ prefix
    attribute: str             # the Settings field
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    shown_default: str = ""    # for the README, when the default is not a plain value


SETTINGS: tuple[Setting, ...] = (
    # the queue
    Setting("DATABASE_URL", "database_urls", _words, (),
            "the database: `mysql+pymysql://user:pass@host/db` (`mysql://` works too) or `sqlite:///path`; "
            "several URLs separated by spaces name candidate primaries, and the queue uses the one that is writable",
            "SQLite under `./instance/`"),
    Setting("READ_URL", "read_url", _text, None,
            "a replica for the dashboard's read-only pages (overview, jobs, job detail, workers, audit log), its lag "
            "shown on each; claims, enqueues, operator actions, health checks and the API always use the primary",
            "none: every page reads from the primary"),
    Setting("REPLICA_URLS", "replica_urls", _server_urls, (),
            "read-only replicas of the primary, separated by spaces: their lag and replication threads are shown on "
            "the health panel, `/api/health` and `jobqueue doctor`, and bulk actions pause while one is behind by "
            "more than `JOBQUEUE_REPLICA_LAG_LIMIT`",
            "none: nothing is watched, bulk actions never pause"),
    Setting("REPLICA_LAG_LIMIT", "replica_lag_limit", _number(int, 1, 3600), 5,
            "seconds a watched replica may be behind before bulk actions wait for it (re-checking) between batches"),
    Setting("INSTANCE_PATH", "instance_path", _text, None, "folder of the default SQLite database", "`./instance`"),
    Setting("LOCK_WAIT_SECONDS", "lock_wait_seconds", _number(int, 1, 3600), 5,
            "how long a fenced write or an operator action waits for a row lock (`innodb_lock_wait_timeout`)"),
    Setting("TASKS", "task_modules", _csv, None, "comma-separated modules that register tasks", "none"),
    Setting("MAX_PAYLOAD_BYTES", "max_payload_bytes", _number(int, 2, 16 * 1024 * 1024), 64 * 1024,
            "largest payload accepted, as compact JSON"),
    Setting("EXPORT_DIR", "export_dir", _text, None, "where the built-in `export_orders` task writes its files",
            "`./instance/exports`"),
    Setting("LOG_LEVEL", "log_level", lambda n, raw: raw.strip().upper() or "INFO", "INFO",
            "DEBUG, INFO, WARNING or ERROR"),
    Setting("LEASE_SECONDS", "lease_seconds", _number(float, 1, 86400), 60.0,
            "lease of the embedded workers' jobs (a standalone worker takes `--lease-seconds`)"),
    Setting("GRACE_SECONDS", "grace_seconds", _number(float, 0, 86400), 20.0,
            "on shutdown, how long the embedded workers' running jobs may finish before they are released"),
    Setting("METRICS_ADDR", "metrics_addr", _text, "127.0.0.1", "address of `jobqueue worker --metrics-port`"),
    # retention
    Setting("KEEP_DONE_DAYS", "keep_done_days", _number(float, 0, 36500), 7.0,
            "days a `done` job is kept before it is pruned (0: forever)", "`7`"),
    Setting("KEEP_FAILED_DAYS", "keep_failed_days", _number(float, 0, 36500), 30.0,
            "days a `failed` or `cancelled` job is kept before it is pruned (0: forever)", "`30`"),
    Setting("KEEP_KEYS_DAYS", "keep_keys_days", _number(float, 0, 36500), 365.0,
            "days a pruned job's task_key is still answered `duplicate: true` (0: forever)", "`365`"),
    # the web process
    Setting("USERS", "users", _secret, None, "dashboard users, `name:role:hash` separated by `;` (see Security)",
            "none: the dashboard refuses to start"),
    Setting("SECRET_KEY", "secret_key", _secret, None, "signs session cookies; the same in every web process",
            "none (generated in development mode)"),
    Setting("API_TOKENS", "api_tokens", _secret, None, "API bearer tokens, `name:role:token` separated by `;`", "none"),
    Setting("DEV", "dev", parse_bool, False, "development mode: localhost only, a generated admin login"),
    Setting("DEV_PASSWORD", "dev_password", _secret, None, "the development admin's password", "generated"),
    Setting("SECURE_COOKIES", "secure_cookies", parse_bool, None,
            "`Secure` session cookies (HTTPS only); set 0 for plain HTTP outside development mode",
            "1, or 0 in development mode"),
    Setting("SESSION_IDLE_MINUTES", "session_idle_minutes", _number(int, 1, 7 * 24 * 60), 60,
            "a dashboard session not used for this long ends (checked on the server, every process and host)"),
    Setting("SESSION_MAX_HOURS", "session_max_hours", _number(float, 0.1, 24 * 30), 12.0,
            "a dashboard session ends this long after sign-in, however busy it is"),
    Setting("TLS_CERT", "tls_cert", _text, None,
            "PEM certificate (chain) for gunicorn to serve HTTPS itself; with `JOBQUEUE_TLS_KEY`", "none: plain HTTP"),
    Setting("TLS_KEY", "tls_key", _text, None, "the certificate's PEM private key", "none"),
    Setting("EMBEDDED_WORKERS", "embedded_workers", _number(int, 0, 256), 2,
            "job threads in each web process (0: none)"),
    Setting("EMBEDDED_QUEUES", "embedded_queues", _csv, None, "comma-separated queues for them", "all"),
    Setting("BIND", "bind", _text, None, "gunicorn's address", "`127.0.0.1:8000`, or `0.0.0.0:$PORT` when `PORT` is set"),
    Setting("WEB_WORKERS", "web_workers", _number(int, 1, 64), 2, "gunicorn worker processes"),
    Setting("WEB_THREADS", "web_threads", _number(int, 1, 256), 4, "threads in each"),
    Setting("COUNTS_CACHE_SECONDS", "counts_cache_seconds", _number(float, 0, 3600), 2.0,
            "how long a web process reuses its ready / running / scheduled counts for every tab, `/metrics` and "
            "`/api/stats` (done, failed and cancelled: 15 times as long, recounted on a thread of the web process "
            "while requests keep the last figures; 0: count at every request); on MariaDB, "
            "counts that are due are not read again while `job_queue` took no write"),
    Setting("ACCESS_LOG", "access_log", _text, None, "gunicorn access log (`-` for standard error)", "none"),
)


@dataclass(frozen=True)
class Settings:
    database_urls: tuple[str, ...] = ()
    read_url: str | None = None
    replica_urls: tuple[str, ...] = ()
    replica_lag_limit: int = 5
    instance_path: str | None = None
    lock_wait_seconds: int = 5
    task_modules: tuple[str, ...] | None = None
    max_payload_bytes: int = 64 * 1024
    export_dir: str | None = None
    log_level: str = "INFO"
    lease_seconds: float = 60.0
    grace_seconds: float = 20.0
    metrics_addr: str | None = "127.0.0.1"
    keep_done_days: float = 7.0
    keep_failed_days: float = 30.0
    keep_keys_days: float = 365.0
    users: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    api_tokens: str | None = field(default=None, repr=False)
    dev: bool = False
    dev_password: str | None = field(default=None, repr=False)
    secure_cookies: bool | None = None
    session_idle_minutes: int = 60
    session_max_hours: float = 12.0
    tls_cert: str | None = None
    tls_key: str | None = None
    embedded_workers: int = 2
    embedded_queues: tuple[str, ...] | None = None
    bind: str | None = None
    web_workers: int = 2
    web_threads: int = 4
    counts_cache_seconds: float = 2.0
    access_log: str | None = None
    port: int | None = None        # PORT, as platforms that run a Procfile set it

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every JOBQUEUE_* variable once. `overrides` (by setting name without the prefix,
        or by attribute) win over the environment: create_app(test_config) and the CLI's flags."""
        env = os.environ if environ is None else environ
        by_name = {s.name: s for s in SETTINGS}
        by_attribute = {s.attribute: s for s in SETTINGS}
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = env.get(PREFIX + setting.name)
            values[setting.attribute] = setting.default if raw is None else setting.parse(setting.name, raw)
        for key, value in overrides.items():
            if key == "port":
                values["port"] = value
                continue
            setting = by_name.get(key) or by_attribute.get(key)
            if setting is None:
                raise TypeError(f"unknown setting {key!r}")
            # Text is parsed as the environment's would be; anything else is already typed.
            values[setting.attribute] = (setting.default if value is None else
                                         setting.parse(setting.name, value) if isinstance(value, str) else value)
        port = env.get("PORT")
        if port and "port" not in values:
            values["port"] = _number(int, 1, 65535)("PORT", port)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    @property
    def database_url(self) -> str | None:
        """The first candidate URL (the one a single-server install has)."""
        return self.database_urls[0] if self.database_urls else None


_installed: Settings | None = None
_from_env: tuple[tuple, Settings] | None = None


def current() -> Settings:
    """This process's settings: those an entry point installed with `use()`, else the
    environment's (parsed again only when a JOBQUEUE_* variable changed)."""
    global _from_env
    if _installed is not None:
        return _installed
    fingerprint = tuple(os.environ.get(PREFIX + s.name) for s in SETTINGS) + (os.environ.get("PORT"),)
    cached = _from_env
    if cached is None or cached[0] != fingerprint:
        cached = _from_env = (fingerprint, Settings.from_env())
    return cached[1]


def use(settings: Settings | None) -> None:
    """Install `settings` as this process's (None: follow the environment again)."""
    global _installed
    _installed = settings


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        default = s.shown_default or (f"`{s.default}`" if s.default not in (None, (), "") else "none")
        if isinstance(s.default, bool):
            default = s.shown_default or ("`1`" if s.default else "`0`")
        rows.append(f"| `{PREFIX}{s.name}` | {default} | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
