"""`jobqueue init-db`: bring the schema to the newest Alembic revision. Safe to run twice, and
from several hosts at once (MySQL/MariaDB: a named lock serialises them)."""

from __future__ import annotations

import logging
import os

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from . import preflight
from .db import is_mysql
from .errors import UnsupportedDatabase
from .logs import event

log = logging.getLogger("jobqueue.migrate")

VERSION_TABLE = "jobqueue_schema_version"
LOCK_NAME = "jobqueue_migrate"
HERE = os.path.dirname(os.path.abspath(__file__))


def _config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(HERE, "migrations"))
    cfg.attributes["connection"] = conn
    return cfg


def head_revision() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(HERE, "migrations"))
    return ScriptDirectory.from_config(cfg).get_current_head()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def init_db(engine: Engine) -> tuple[str | None, str]:
    """Apply pending migrations; returns (revision before, revision after)."""
    with engine.connect() as conn:
        info = preflight.server_info(conn)
        preflight.check_version(info)
        if is_mysql(conn):
            preflight.check_writable(conn)
            # Refuse before the first DDL: under statement-based binlogs the DDL goes through but
            # the version row cannot be written (error 1665), leaving a schema init-db cannot finish.
            preflight.check_binlog(conn)
            got = conn.exec_driver_sql(f"SELECT GET_LOCK('{LOCK_NAME}', 120)").scalar()
            if got != 1:
                raise UnsupportedDatabase("timed out waiting for another init-db to finish")
        try:
            before = current_revision(conn)
            conn.commit()
            command.upgrade(_config(conn), "head")
            conn.commit()
            after = current_revision(conn)
            if is_mysql(conn):
                preflight.check_engines(conn)
        finally:
            if is_mysql(conn):
                conn.exec_driver_sql(f"SELECT RELEASE_LOCK('{LOCK_NAME}')")
            conn.commit()
    if before != after:
        event(log, logging.INFO, "migrated", **{"from": before, "to": after})
    return before, after
