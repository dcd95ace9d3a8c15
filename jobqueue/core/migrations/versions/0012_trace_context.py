"""OpenTelemetry: job_queue.trace_context and job_batch.trace_context.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

Both are INSTANT ADD COLUMNs (nullable, at the end) with no index: the worker reads a job's by
primary key, only when tracing is on (jobqueue/core/tracing.py).
"""

import sqlalchemy as sa
from alembic import op

from jobqueue.core.migrations import online

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    online.add_column("job_queue", sa.Column("trace_context", sa.String(255), nullable=True))
    op.add_column("job_batch", sa.Column("trace_context", sa.String(255), nullable=True))


def downgrade() -> None:
    op.drop_column("job_batch", "trace_context")
    online.drop_column("job_queue", "trace_context")
