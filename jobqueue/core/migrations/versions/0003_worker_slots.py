"""What each worker slot holds (job, attempt, task, since when, lease lost or not), for the
workers page and /api/health.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column at the end: INSTANT on MariaDB 10.3+ and MySQL 8.0 (no table copy).
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.execute("ALTER TABLE worker_process ADD COLUMN state TEXT NULL, ALGORITHM=INSTANT")
    else:
        op.add_column("worker_process", sa.Column("state", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("worker_process", "state")
