"""The soak's enqueuers: most jobs through `POST /api/jobs`, some through `jobqueue enqueue`, each
retried with the same task_key on 5xx, connection errors and exit 1/75 until acknowledged."""

from __future__ import annotations

import http.client
import json
import queue as queue_mod
import subprocess
import sys
import threading
import time

from soak.checks import Spec
from testkit.faults import http_json, next_pause
from testkit.procs import REPO


class Enqueuers:
    """The enqueue half of `Soak` (soak/run.py): its web port, token, URL and records."""

    def _http(
        self,
        method: str,
        path: str,
        body: dict | None,
        timeout: float = 10,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, dict]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=timeout)
        try:
            return http_json(conn, self.token, method, path, body)
        finally:
            if own:
                conn.close()

    def enqueue_api(
        self, spec: Spec, payload: dict, delay: float, conn_box: list, deadline_s: float = 180
    ) -> tuple[str, dict | None]:
        """POST until the queue answers 200/201; the same task_key on every try. ('ok', body),
        ('rejected', body) for a 4xx, ('gave_up', None)."""
        body = {"task": "soak", "task_key": spec.task_key, "payload": payload, "max_attempts": spec.max_attempts}
        if delay:
            body["delay"] = delay
        deadline = time.monotonic() + deadline_s
        pause = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                if conn_box[0] is None:
                    conn_box[0] = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=15)
                status, answer = self._http("POST", "/api/jobs", body, conn=conn_box[0])
                if status in (200, 201):
                    answer["_tries"] = tries
                    return "ok", answer
                if 400 <= status < 500:
                    return "rejected", {"status": status, **answer}
                self.enqueue_retries[f"api {status}"] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.enqueue_retries[f"api {type(exc).__name__}"] += 1
                if conn_box[0] is not None:
                    conn_box[0].close()
                conn_box[0] = None
            if time.monotonic() > deadline:
                return "gave_up", None
            pause = next_pause(pause)

    def enqueue_cli(self, spec: Spec, payload: dict, delay: float, deadline_s: float = 180) -> tuple[str, dict | None]:
        argv = [
            sys.executable,
            "-m",
            "jobqueue.cli",
            "--database-url",
            self.url,
            "--log-level",
            "WARNING",
            "enqueue",
            "soak",
            "--key",
            spec.task_key,
            "--payload",
            json.dumps(payload),
            "--max-attempts",
            str(spec.max_attempts),
            "--tasks",
            "soak.tasks",
        ]
        if delay:
            argv += ["--delay", str(delay)]
        deadline = time.monotonic() + deadline_s
        pause = 0.2
        tries = 0
        while True:
            tries += 1
            try:
                out = subprocess.run(argv, capture_output=True, text=True, env=self.base_env(), cwd=REPO, timeout=60)
            except subprocess.TimeoutExpired:
                self.enqueue_retries["cli timeout"] += 1
            else:
                if out.returncode == 0:
                    answer = json.loads(out.stdout.strip().splitlines()[-1])
                    answer["_tries"] = tries
                    return "ok", answer
                if out.returncode not in (1, 75):  # 75: no writable primary right now, try again
                    return "rejected", {"code": out.returncode, "stderr": out.stderr[-500:]}
                self.enqueue_retries[f"cli exit {out.returncode}"] += 1
            if time.monotonic() > deadline:
                return "gave_up", None
            pause = next_pause(pause)

    def run_enqueuers(self, jobs: list[tuple[Spec, dict, float]]) -> list[threading.Thread]:
        api_q: queue_mod.Queue = queue_mod.Queue()
        cli_q: queue_mod.Queue = queue_mod.Queue()
        for item in jobs:
            self.specs[item[0].task_key] = item[0]
            self.payloads[item[0].task_key] = (item[1], item[2])
            (cli_q if item[0].via == "cli" else api_q).put(item)

        def api_loop():
            box = [None]
            while True:
                try:
                    spec, payload, delay = api_q.get_nowait()
                except queue_mod.Empty:
                    break
                self.record_ack(spec, *self.enqueue_api(spec, payload, delay, box))
            if box[0] is not None:
                box[0].close()

        def cli_loop():
            while True:
                try:
                    spec, payload, delay = cli_q.get_nowait()
                except queue_mod.Empty:
                    break
                self.record_ack(spec, *self.enqueue_cli(spec, payload, delay))

        threads = [
            threading.Thread(target=self.guarded(api_loop), name=f"api-{i}", daemon=True)
            for i in range(self.plan.api_threads)
        ]
        threads += [
            threading.Thread(target=self.guarded(cli_loop), name=f"cli-{i}", daemon=True)
            for i in range(self.plan.cli_threads)
        ]
        for t in threads:
            t.start()
        return threads

    def enqueue_again(self, key: str, n: int, via_api: bool, box: list) -> tuple[str, dict | None]:
        spec = self.specs[key]
        payload, delay = self.payloads[key]
        if via_api:
            return self.enqueue_api(spec, payload, delay, box)
        return self.enqueue_cli(spec, payload, delay)
