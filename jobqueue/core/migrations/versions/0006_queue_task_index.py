"""An index on (queue, task_name, id), for a page of one task in one queue.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

Without it `/jobs?queue=mail&task=export_orders` read every entry of the task and its row to check
the queue: 0.7 s per statement at 1,000,000 rows when the pair never goes together. Built in
place while the table takes reads and writes (online.create_index).
"""

from jobqueue.core.migrations import online

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    online.create_index("ix_queue_task", "job_queue", ["queue", "task_name", "id"])


def downgrade() -> None:
    online.drop_index("ix_queue_task", "job_queue")
