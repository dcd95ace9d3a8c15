"""task_definition: the tasks worker processes registered, so that a producer that imports no
handler can enqueue by name.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
TABLE_ARGS = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}


def upgrade() -> None:
    op.create_table(
        "task_definition",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("concurrency_key", sa.String(100), nullable=True),
        sa.Column("concurrency_limit", sa.Integer(), nullable=True),
        sa.Column("registered_by", sa.String(64), nullable=False),
        sa.Column("registered_at", TS, nullable=False),
        **TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("task_definition")
