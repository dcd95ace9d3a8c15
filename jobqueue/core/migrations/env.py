"""Alembic environment: run by `jobqueue init-db` (jobqueue.core.migrate) with a live connection."""

from alembic import context

config = context.config
connection = config.attributes["connection"]
context.configure(
    connection=connection, target_metadata=None, transaction_per_migration=True, version_table="jobqueue_schema_version"
)
with context.begin_transaction():
    context.run_migrations()
