"""firm-queue's job for bench/mysql_peers.py (its registry names a job by module and function,
so the job lives here, imported alike by the enqueuer and the workers)."""

import os

import firm.queue as bq

from bench.peer_apps.append_line import append_line

# Its docs' MySQL/MariaDB driver: PyMySQL ("mysql://" is normalised to mysql+pymysql://).
bq.configure(database_url=os.environ["BENCH_FIRM_URL"])


@bq.job()
def append(key: str) -> None:
    append_line(key)
