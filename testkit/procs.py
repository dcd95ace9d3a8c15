"""Real worker processes for the acceptance tests, with their logs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def jobqueue(url: str, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one `jobqueue` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "jobqueue.cli", "--database-url", url, *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        cwd=REPO,
        timeout=timeout,
    )


class WorkerProcess:
    """`jobqueue worker` for real, logging at DEBUG so that its claims (one DEBUG line each) can be
    read back."""

    def __init__(self, url: str, log_dir: Path, name: str, *args: str, env: dict | None = None):
        self.name = name
        env = env or cli_env()
        env.setdefault("JOBQUEUE_LOG_LEVEL", "DEBUG")
        self.log_path = log_dir / f"worker-{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                url,
                "worker",
                "--name",
                name,
                "--tasks",
                "testkit.tasks",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_log(self, pattern: str, timeout: float = 15.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{pattern!r} not in the log of worker {self.name} (exit code {self.proc.poll()}):\n{self.log()[-3000:]}"
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()


def claimed_ids(*workers: WorkerProcess) -> Counter:
    """How many times each job id was claimed, read from the workers' own logs."""
    counts: Counter = Counter()
    for w in workers:
        counts.update(int(m) for m in re.findall(r"event=claim job_id=(\d+) ", w.log()))
    return counts


def run_report(out: subprocess.CompletedProcess, workdir: Path, verdict_prefix: str) -> str:
    """What a failed assertion on a soak or drill run shows: its verdict line first (the one line
    a CI summary keeps, problems included), then the ends of its output."""
    verdicts = [line for line in out.stdout.splitlines() if line.startswith(verdict_prefix)]
    first = verdicts[-1] if verdicts else "no verdict line"
    return f"exit {out.returncode}: {first}; logs in {workdir}\n{out.stdout[-6000:]}\n{out.stderr[-3000:]}"


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GunicornServer:
    """The dashboard for real: gunicorn with our config file, embedded workers and the reaper."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        *,
        web_workers: int = 2,
        embedded_workers: int = 2,
        extra_env: dict | None = None,
        tls: tuple[Path, Path] | None = None,
        name: str = "gunicorn",
        app_uri: str | None = None,
        chdir: Path | None = None,
        ready_path: str = "/healthz",
    ):
        import ssl
        import urllib.request

        self.port = free_port()
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        # A test's own self-signed certificate: not verified by the readiness probe.
        self.ssl_context = ssl._create_unverified_context() if tls else None
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")
        env = cli_env(
            JOBQUEUE_DATABASE_URL=url,
            JOBQUEUE_BIND=f"127.0.0.1:{self.port}",
            JOBQUEUE_LOG_LEVEL="DEBUG",
            JOBQUEUE_WEB_WORKERS=str(web_workers),
            JOBQUEUE_EMBEDDED_WORKERS=str(embedded_workers),
            JOBQUEUE_TASKS="testkit.tasks",
        )
        if tls:
            env.update(JOBQUEUE_TLS_CERT=str(tls[0]), JOBQUEUE_TLS_KEY=str(tls[1]))
        env.update(extra_env or {})
        # app_uri: another application (a host app with the dashboard mounted) under our config.
        command = [sys.executable, "-m", "gunicorn", "-c", str(REPO / "jobqueue/web/gunicorn_conf.py")]
        if chdir is not None:
            command += ["--chdir", str(chdir)]
        self.proc = subprocess.Popen(
            command + ([app_uri] if app_uri else []), stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.base + ready_path, timeout=2, context=self.ssl_context) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"gunicorn did not come up:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
