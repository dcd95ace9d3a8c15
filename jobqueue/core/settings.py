"""Every `JOBQUEUE_*` setting, read in one place into one typed object.

An entry point (the `jobqueue` command, `create_app`, gunicorn's config, `JobQueue.from_env()`)
calls `Settings.from_env()` once and passes what each part needs down: the engine its URL and
lock wait, a worker its lease and grace, the web app its users and tokens. Code that is handed
no settings (a handler importing `jobqueue.core.builtin_tasks`, a test) uses `current()`, the
process's settings, read from the environment on first use.

Each setting is declared once, as a field of `Settings` (`setting(...)`: name, parser, default,
help). `SETTINGS` lists them for the environment, app.config and the command line's defaults, and
docs/configuration.md is its table (`python -m jobqueue.core.settings` prints it; a test keeps the
two equal).
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
            raise SettingsError(
                f"{PREFIX}{name} must be {'a whole number' if kind is int else 'a number'}; got {raw!r}"
            ) from None
        if value != value or (low is not None and value < low) or (high is not None and value > high):  # NaN too
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
            raise SettingsError(
                f"{PREFIX}{name} takes MySQL/MariaDB server URLs separated by spaces "
                f"(mysql+pymysql://user:pass@host:port); got one starting {scheme or url[:8]!r}"
            )
    return urls


def _secret(name: str, raw: str) -> str | None:
    return raw or None


_INFO = "INFO"


def _log_level(name: str, raw: str) -> str:
    return raw.strip().upper() or _INFO


@dataclass(frozen=True)
class Setting:
    name: str  # without the JOBQUEUE_ prefix
    attribute: str  # the Settings field
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    shown_default: str = ""  # for the docs, when the default is not a plain value


def setting(
    name: str,
    parse: Callable[[str, str], Any],
    default: Any,
    doc: str,
    shown_default: str = "",
    *,
    secret: bool = False,
) -> Any:
    """A Settings field and everything said of it, declared once: the environment, app.config,
    the command line's defaults (cli.setting_option) and the docs' table all read it from here."""
    return field(
        default=default, repr=not secret, metadata={"setting": Setting(name, "", parse, default, doc, shown_default)}
    )


@dataclass(frozen=True)
class Settings:
    # the queue
    database_urls: tuple[str, ...] = setting(
        "DATABASE_URL",
        _words,
        (),
        "the database: `mysql+pymysql://user:pass@host/db` (`mysql://` works too), "
        "`mysql+mysqldb://user:pass@host/db` with mysqlclient (the extra `jobqueue[mysqlclient]`) or "
        "`sqlite:///path`; several URLs separated by spaces name candidate primaries (PyMySQL URLs), and "
        "the queue uses the one that is writable",
        "SQLite under `./instance/`",
    )
    read_url: str | None = setting(
        "READ_URL",
        _text,
        None,
        "a replica for the dashboard's read-only pages (overview, jobs, job detail, workers, audit log), "
        "its lag shown on each; claims, enqueues, operator actions, health checks and the API always use "
        "the primary",
        "none: every page reads from the primary",
    )
    replica_urls: tuple[str, ...] = setting(
        "REPLICA_URLS",
        _server_urls,
        (),
        "read-only replicas of the primary, separated by spaces: their lag and replication threads are "
        "shown on the health panel, `/api/health` and `jobqueue doctor`, and bulk actions pause while one"
        " is behind by more than `JOBQUEUE_REPLICA_LAG_LIMIT`",
        "none: nothing is watched, bulk actions never pause",
    )
    replica_lag_limit: int = setting(
        "REPLICA_LAG_LIMIT",
        _number(int, 1, 3600),
        5,
        "seconds a watched replica may be behind before bulk actions wait for it (re-checking) between batches",
    )
    instance_path: str | None = setting(
        "INSTANCE_PATH", _text, None, "folder of the default SQLite database", "`./instance`"
    )
    lock_wait_seconds: int = setting(
        "LOCK_WAIT_SECONDS",
        _number(int, 1, 3600),
        5,
        "how long a fenced write or an operator action waits for a row lock (`innodb_lock_wait_timeout`)",
    )
    idle_transaction_seconds: int = setting(
        "IDLE_TRANSACTION_SECONDS",
        _number(int, 1, 86400),
        30,
        "how long the server keeps a worker's transaction that stopped sending statements (its process "
        "frozen or cut off mid-claim) before it ends it and frees the rows it held (MariaDB "
        "`idle_transaction_timeout`, MySQL `wait_timeout`, on worker sessions only)",
    )
    task_modules: tuple[str, ...] | None = setting(
        "TASKS", _csv, None, "comma-separated modules that register tasks", "none"
    )
    max_payload_bytes: int = setting(
        "MAX_PAYLOAD_BYTES", _number(int, 2, 16 * 1024 * 1024), 64 * 1024, "largest payload accepted, as compact JSON"
    )
    export_dir: str | None = setting(
        "EXPORT_DIR", _text, None, "where the built-in `export_orders` task writes its files", "`./instance/exports`"
    )
    log_level: str = setting("LOG_LEVEL", _log_level, _INFO, "DEBUG, INFO, WARNING or ERROR")
    lease_seconds: float = setting(
        "LEASE_SECONDS",
        _number(float, 1, 86400),
        60.0,
        "how long a claimed job is leased to its worker, renewed every third of it (embedded workers, "
        "and the default of `jobqueue worker --lease-seconds`)",
    )
    grace_seconds: float = setting(
        "GRACE_SECONDS",
        _number(float, 0, 86400),
        20.0,
        "on shutdown, how long running jobs may finish before they are released (embedded workers, and "
        "the default of `jobqueue worker --grace-seconds`)",
    )
    otel: bool = setting(
        "OTEL",
        parse_bool,
        True,
        "OpenTelemetry spans, stored trace contexts and histograms, once `jobqueue[otel]` is installed and "
        "the application set a tracer or meter provider ([tracing.md](tracing.md)); 0 turns them off",
    )
    metrics_addr: str | None = setting(
        "METRICS_ADDR", _text, "127.0.0.1", "address of `jobqueue worker --metrics-port`"
    )
    # retention
    keep_done_days: float = setting(
        "KEEP_DONE_DAYS", _number(float, 0, 36500), 7.0, "days a `done` job is kept before it is pruned (0: forever)"
    )
    keep_failed_days: float = setting(
        "KEEP_FAILED_DAYS",
        _number(float, 0, 36500),
        30.0,
        "days a `failed` or `cancelled` job is kept before it is pruned (0: forever)",
    )
    keep_keys_days: float = setting(
        "KEEP_KEYS_DAYS",
        _number(float, 0, 36500),
        365.0,
        "days a pruned job's task_key is still answered `duplicate: true` (0: forever)",
    )
    # the web process
    users: str | None = setting(
        "USERS",
        _secret,
        None,
        "dashboard users, `name:role:hash` separated by `;` (see Security)",
        "none: the dashboard refuses to start",
        secret=True,
    )
    secret_key: str | None = setting(
        "SECRET_KEY",
        _secret,
        None,
        "signs session cookies; the same in every web process",
        "none (generated in development mode)",
        secret=True,
    )
    api_tokens: str | None = setting(
        "API_TOKENS", _secret, None, "API bearer tokens, `name:role:token` separated by `;`", "none", secret=True
    )
    dev: bool = setting("DEV", parse_bool, False, "development mode: localhost only, a generated admin login")
    dev_password: str | None = setting(
        "DEV_PASSWORD", _secret, None, "the development admin's password", "generated", secret=True
    )
    secure_cookies: bool | None = setting(
        "SECURE_COOKIES",
        parse_bool,
        None,
        "`Secure` session cookies (HTTPS only); set 0 for plain HTTP outside development mode",
        "1, or 0 in development mode",
    )
    session_idle_minutes: int = setting(
        "SESSION_IDLE_MINUTES",
        _number(int, 1, 7 * 24 * 60),
        60,
        "a dashboard session not used for this long ends (checked on the server, every process and host)",
    )
    session_max_hours: float = setting(
        "SESSION_MAX_HOURS",
        _number(float, 0.1, 24 * 30),
        12.0,
        "a dashboard session ends this long after sign-in, however busy it is",
    )
    tls_cert: str | None = setting(
        "TLS_CERT",
        _text,
        None,
        "PEM certificate (chain) for gunicorn to serve HTTPS itself; with `JOBQUEUE_TLS_KEY`",
        "none: plain HTTP",
    )
    tls_key: str | None = setting("TLS_KEY", _text, None, "the certificate's PEM private key", "none")
    embedded_workers: int = setting(
        "EMBEDDED_WORKERS", _number(int, 0, 256), 2, "job threads in each web process (0: none)"
    )
    embedded_queues: tuple[str, ...] | None = setting(
        "EMBEDDED_QUEUES", _csv, None, "comma-separated queues for them", "all"
    )
    bind: str | None = setting(
        "BIND", _text, None, "gunicorn's address", "`127.0.0.1:8000`, or `0.0.0.0:$PORT` when `PORT` is set"
    )
    web_workers: int = setting("WEB_WORKERS", _number(int, 1, 64), 2, "gunicorn worker processes")
    web_threads: int = setting("WEB_THREADS", _number(int, 1, 256), 4, "threads in each")
    counts_cache_seconds: float = setting(
        "COUNTS_CACHE_SECONDS",
        _number(float, 0, 3600),
        2.0,
        "how long a web process reuses its ready / running / scheduled counts for every tab, `/metrics` "
        "and `/api/stats` (done, failed and cancelled: 15 times as long, recounted on a thread of the web"
        " process while requests keep the last figures; 0: count at every request); on MariaDB, counts "
        "that are due are not read again while `job_queue` took no write",
    )
    access_log: str | None = setting("ACCESS_LOG", _text, None, "gunicorn access log (`-` for standard error)", "none")
    port: int | None = None  # PORT, as platforms that run a Procfile set it

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every JOBQUEUE_* variable once. `overrides` (by setting name without the prefix,
        or by attribute) win over the environment: create_app(test_config) and the CLI's flags."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            raw = env.get(PREFIX + setting.name)
            values[setting.attribute] = setting.default if raw is None else setting.parse(setting.name, raw)
        for key, value in overrides.items():
            if key == "port":
                values["port"] = value
                continue
            setting = BY_NAME.get(key) or BY_ATTRIBUTE.get(key)
            if setting is None:
                raise TypeError(f"unknown setting {key!r}")
            # Text is parsed as the environment's would be; anything else is already typed.
            values[setting.attribute] = (
                setting.default
                if value is None
                else setting.parse(setting.name, value)
                if isinstance(value, str)
                else value
            )
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


SETTINGS: tuple[Setting, ...] = tuple(
    dataclasses.replace(f.metadata["setting"], attribute=f.name)
    for f in dataclasses.fields(Settings)
    if "setting" in f.metadata
)
BY_NAME = {s.name: s for s in SETTINGS}
BY_ATTRIBUTE = {s.attribute: s for s in SETTINGS}
DEFAULTS = Settings()


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


PAGE_HEAD = """# Configuration

Every setting is an environment variable, read once at start by `jobqueue/core/settings.py`, where
each is declared once (name, parser, default, help). This page is made from those declarations
(`python -m jobqueue.core.settings > docs/configuration.md`; a test keeps the two the same).
Command-line flags, where a command has them, win over the environment, and take their defaults
from the same declarations (`jobqueue worker --lease-seconds`, `--grace-seconds`, `jobqueue serve
--web-workers`, ...).

"""

PAGE_TAIL = """
`PORT` (set by platforms that run a Procfile) makes gunicorn bind `0.0.0.0:$PORT` when
`JOBQUEUE_BIND` is not set; `jobqueue serve --port` and `scripts/run-app` take it too.
"""


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if value in (None, (), ""):
        return "none"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{PREFIX}{s.name}` | {s.shown_default or _shown(s.default)} | {s.doc} |")
    return "\n".join(rows)


def markdown_page() -> str:
    """docs/configuration.md."""
    return PAGE_HEAD + markdown_table() + "\n" + PAGE_TAIL


if __name__ == "__main__":
    sys.stdout.write(markdown_page())
