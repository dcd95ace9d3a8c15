"""gunicorn settings for the dashboard with embedded workers.

    gunicorn -c jobqueue/web/gunicorn_conf.py

Nothing queue-related starts in the master. Each worker process builds the app after the fork
(or, with --preload, drops the connections it inherited) and starts its embedded workers and
reaper in post_worker_init; on its way out (SIGTERM, max-requests, shutdown) it stops them,
which releases unfinished jobs back to ready.
"""

import os
import shutil
import sys
import tempfile
import threading
import time

from jobqueue.core.settings import Settings

# Prometheus multiprocess mode: each worker process writes its counters to files here and
# /metrics adds them up. Set before any worker imports prometheus_client (workers build the app
# after the fork), emptied when the master starts.
_OWN_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _OWN_METRICS_DIR:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="jobqueue-metrics-")

_settings = Settings.from_env()

# `jobqueue serve` passes a banner (the URL, the login) to print once every worker process has
# started: each one leaves a file here when its embedded workers have finished their first turn.
_BANNER = os.environ.get("_JOBQUEUE_SERVE_BANNER")
_READY_DIR = tempfile.mkdtemp(prefix="jobqueue-ready-") if _BANNER else None

wsgi_app = "jobqueue:create_app()"
# JOBQUEUE_BIND wins; a platform's PORT (Procfile deploys) binds every interface on that port.
bind = _settings.bind or (f"0.0.0.0:{_settings.port}" if _settings.port else "127.0.0.1:8000")
workers = _settings.web_workers
worker_class = "gthread"
threads = _settings.web_threads
timeout = 60
# Longer than the embedded workers' grace plus their last writes, so they can release jobs.
graceful_timeout = max(30, int(_settings.grace_seconds) + 10)
accesslog = _settings.access_log
# HTTPS served by gunicorn itself (a proxy in front that ends TLS is the other way).
if bool(_settings.tls_cert) != bool(_settings.tls_key):
    raise SystemExit("JOBQUEUE_TLS_CERT and JOBQUEUE_TLS_KEY go together: set both or neither")
certfile = _settings.tls_cert
keyfile = _settings.tls_key


def _runtime(app):
    ext = getattr(app, "extensions", {}).get("jobqueue") if app is not None else None
    return ext.runtime if ext is not None else None


def on_starting(server):
    folder = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))


def when_ready(server):
    # `jobqueue serve` wants the URL and the login to be the last thing a newcomer reads: after
    # gunicorn's own lines and every worker process's start-up lines.
    if not _BANNER:
        return

    def show():
        deadline = time.monotonic() + 60
        while len(os.listdir(_READY_DIR)) < server.num_workers and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the last worker's own lines, written just before its marker
        sys.stderr.write("\n" + _BANNER + "\n\n")
        sys.stderr.flush()
        shutil.rmtree(_READY_DIR, ignore_errors=True)

    threading.Thread(target=show, name="jobqueue-banner", daemon=True).start()


def on_exit(server):
    if _READY_DIR:
        shutil.rmtree(_READY_DIR, ignore_errors=True)
    if _OWN_METRICS_DIR:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def post_fork(server, worker):
    # With --preload the app (and its connection pool) was built in the master.
    runtime = _runtime(getattr(worker.app, "callable", None))
    if runtime is not None:
        runtime.after_fork()


def post_worker_init(worker):
    runtime = _runtime(getattr(worker, "wsgi", None))
    if runtime is not None:
        runtime.start()
    if _READY_DIR:
        if runtime is not None:
            runtime.wait_running()
        sys.stderr.flush()
        open(os.path.join(_READY_DIR, str(os.getpid())), "w").close()


def worker_exit(server, worker):
    runtime = _runtime(getattr(worker, "wsgi", None))
    if runtime is not None:
        runtime.stop()
