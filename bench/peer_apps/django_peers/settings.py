"""Settings for the MySQL peers' Django project. $BENCH_PEER is one of dj_queue,
django_tasks_db, django_q; $BENCH_DB_NAME / _HOST / _PORT the run's database (root, no password);
$BENCH_THREADS the dj-queue worker's threads, $BENCH_WORKERS django-q2's worker processes.

Each peer is configured as its documentation recommends for throughput (bench/mysql_peers.py says
where each setting comes from):

- every peer: DEBUG off (no query log kept in memory, no autoreloading worker) and persistent
  connections (CONN_MAX_AGE): Django's docs, "Persistent connections avoid the overhead of
  re-establishing a connection to the database in each request"; dj-queue's README: "Consider
  a positive Django CONN_MAX_AGE ... It can materially improve worker throughput by reusing
  worker-thread connections".
- dj-queue: standalone `async` mode (one process, its actors as threads; "In async mode, worker
  processes > 1 is ignored"), one worker of $BENCH_THREADS threads, the other options at their
  defaults (polling_interval 0.1, prefetch_multiplier 2).
- django-tasks-db: nothing to set; its worker's knobs are command options (db_worker).
- django-q2: the ORM broker as its docs' example sets it (timeout 90, retry 120, queue_limit 50,
  bulk 10: "Setting this on supported brokers can improve performance"), $BENCH_WORKERS workers,
  save_limit 0 (every success kept: its `stopped` is the finish measured), the scheduler
  off ("This will reduce a little overhead if you're not using schedules").
"""

from __future__ import annotations

import os

PEER = os.environ.get("BENCH_PEER", "dj_queue")

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": os.environ.get("BENCH_DB_NAME", "bench"),
        "HOST": os.environ.get("BENCH_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_DB_PORT", "3306"),
        "USER": os.environ.get("BENCH_DB_USER", "root"),
        "PASSWORD": os.environ.get("BENCH_DB_PASSWORD", ""),
        "CONN_MAX_AGE": 600,
        "OPTIONS": {"charset": "utf8mb4"},
    }
}

INSTALLED_APPS = ["django.contrib.contenttypes", "bench.peer_apps.django_peers.apps.DjangoPeersConfig"]

if PEER == "dj_queue":
    INSTALLED_APPS.append("dj_queue")
    DATABASE_ROUTERS = ["dj_queue.routers.DjQueueRouter"]
    TASKS = {
        "default": {
            "BACKEND": "dj_queue.backend.DjQueueBackend",
            "QUEUES": [],
            "OPTIONS": {
                "mode": "async",
                "workers": [{"queues": "*", "threads": int(os.environ.get("BENCH_THREADS", "16")), "processes": 1}],
            },
        }
    }
elif PEER == "django_tasks_db":
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
elif PEER == "django_q":
    INSTALLED_APPS.append("django_q")
    Q_CLUSTER = {
        "name": "bench",
        "workers": int(os.environ.get("BENCH_WORKERS", "16")),
        "timeout": 90,
        "retry": 120,
        "queue_limit": 50,
        "bulk": 10,
        "orm": "default",
        "save_limit": 0,
        "scheduler": False,
    }
else:
    raise RuntimeError(f"BENCH_PEER={PEER!r}: one of dj_queue, django_tasks_db, django_q")
