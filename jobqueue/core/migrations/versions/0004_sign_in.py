"""Sign-in state shared by every web process and host: dashboard sessions (so that logout, a
password change and "sign out everywhere" end them on the server) and the login throttle's
counters (so that its limits hold behind any number of gunicorn workers).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004"
down_revision = "0003"
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
        "web_session",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_name", sa.String(100), nullable=False),
        sa.Column("credential", sa.String(64), nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_seen_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("end_reason", sa.String(20), nullable=True),
        **TABLE_ARGS,
    )
    op.create_index("ix_session_user", "web_session", ["user_name", "ended_at"])
    op.create_index("ix_session_seen", "web_session", ["last_seen_at"])

    op.create_table(
        "login_throttle",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("blocked_until", TS, nullable=True),
        sa.Column("expires_at", TS, nullable=False),
        **TABLE_ARGS,
    )
    op.create_index("ix_throttle_expiry", "login_throttle", ["expires_at"])


def downgrade() -> None:
    op.drop_table("login_throttle")
    op.drop_table("web_session")
