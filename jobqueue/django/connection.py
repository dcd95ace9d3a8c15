"""The queue's repository on Django's own database connection.

An enqueue must exist exactly when the caller's `transaction.atomic()` block commits, so it is
written on the very DB-API connection Django holds for that alias in this thread, inside Django's
transaction. The repository speaks SQLAlchemy, so each alias gets one Engine whose pool lends that
connection out and whose dialect leaves COMMIT and ROLLBACK to Django: SAVEPOINTs (the
repository's own undo inside a caller's transaction) still go to the server, but the transaction
is opened, committed and rolled back by Django's atomic blocks only, and the connection is closed
by Django (CONN_MAX_AGE), never by the pool. A SQLAlchemy Connection over Django's cursor was the
other way; the repository needs the dialect (statement compilation, savepoints, error wrapping),
so lending the connection keeps every repository verb usable as it is.

Django must reach MySQL or MariaDB through PyMySQL (`pymysql.install_as_MySQLdb()` before Django
loads its backend), the driver the repository's statements are written for.
"""

from __future__ import annotations

import threading
from urllib.parse import quote

import sqlalchemy as sa
from django.db import connections, transaction
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool


class DjangoTransactions(MySQLDialect_pymysql):
    """PyMySQL's dialect, with the transaction's end left to Django."""

    supports_statement_cache = True

    def do_commit(self, dbapi_connection) -> None:
        pass

    def do_rollback(self, dbapi_connection) -> None:
        pass


sa.dialects.registry.register("mysql.jobqueue_django", __name__, "DjangoTransactions")


class LentConnections(Pool):
    """Lends the DB-API connection Django holds for `alias` in the calling thread: a fresh entry
    per checkout (Django may have reconnected since), never reset, closed or kept."""

    def __init__(self, alias: str, **kwargs) -> None:
        self.alias = alias
        super().__init__(self._borrow, reset_on_return=None, **kwargs)

    def _borrow(self):
        django_connection = connections[self.alias]
        django_connection.ensure_connection()
        return django_connection.connection

    def _do_get(self):
        return self._create_connection()

    def _do_return_conn(self, record) -> None:
        pass

    def _close_connection(self, connection, *, terminate: bool = False) -> None:
        pass  # Django's connection: Django closes it

    def status(self) -> str:
        return f"LentConnections({self.alias!r})"

    def dispose(self) -> None:
        pass

    def recreate(self) -> LentConnections:
        return self.__class__(self.alias, _dispatch=self.dispatch, dialect=self._dialect)


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def lent_engine(alias: str) -> Engine:
    """The Engine over Django's connection for `alias` (one per alias and process)."""
    with _lock:
        engine = _engines.get(alias)
        if engine is None:
            require_mysql(alias)
            engine = sa.create_engine("mysql+jobqueue_django://", pool=LentConnections(alias))

            @sa.event.listens_for(engine, "connect")
            def _after_commit(dbapi_connection, record) -> None:
                # The repository reports an enqueue (wakes idle workers, rings other processes'
                # sleepers, counts it) when the transaction commits: Django's on_commit says when.
                record.info["after_commit"] = lambda report: transaction.on_commit(report, using=alias)

            _engines[alias] = engine
        return engine


def require_mysql(alias: str) -> None:
    """Refuse, saying why, a database alias the queue cannot write on."""
    from django.core.exceptions import ImproperlyConfigured

    django_connection = connections[alias]
    if django_connection.vendor != "mysql":
        raise ImproperlyConfigured(
            f"jobqueue.django: DATABASES[{alias!r}] is {django_connection.vendor}; the queue runs on MySQL or MariaDB"
        )
    import pymysql

    django_connection.ensure_connection()
    if not isinstance(django_connection.connection, pymysql.connections.Connection):
        raise ImproperlyConfigured(
            f"jobqueue.django: DATABASES[{alias!r}] must use PyMySQL: call "
            "pymysql.install_as_MySQLdb() at the top of your settings module"
        )


def database_url(alias: str) -> str:
    """A SQLAlchemy URL for the same database as DATABASES[alias], for the queue's own engines
    (the worker, the dashboard)."""
    db = connections[alias].settings_dict
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"mysql+pymysql://{auth}{host}{port}/{quote(db['NAME'], safe='')}"
