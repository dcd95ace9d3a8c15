"""The soak's enqueuers: most jobs through `POST /api/jobs`, some through `jobqueue enqueue`, each
retried with the same task_key on 5xx, connection errors and exit 1/75 until acknowledged.
Workflows (soak/plan.py workflow_groups) go through the API from one thread of their own, a
group at a time, parents before children: `POST /api/batches`, its members with "batch", then
`POST /api/batches/<key>/close`, each retried the same way (opening, enqueueing and closing are
all idempotent)."""

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
        if spec.after:
            body["after"] = list(spec.after)
            body["on_parent_failure"] = spec.on_parent_failure
        if spec.batch:
            body["batch"] = spec.batch
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
        for parent in spec.after:
            argv += ["--after", parent]
        if spec.after:
            argv += ["--on-parent-failure", spec.on_parent_failure]
        if spec.batch:
            argv += ["--batch", spec.batch]
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

    def batch_call(self, path: str, body: dict, conn_box: list, deadline_s: float = 180) -> dict | None:
        """POST a batch's open or close until it answers 200/201 (None: a 4xx, or gave up)."""
        deadline = time.monotonic() + deadline_s
        pause = 0.1
        while True:
            try:
                if conn_box[0] is None:
                    conn_box[0] = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=15)
                status, answer = self._http("POST", path, body, conn=conn_box[0])
                if status in (200, 201):
                    return answer
                if 400 <= status < 500:
                    self.enqueue_rejected.append(f"POST {path}: {status} {answer}")
                    return None
                self.enqueue_retries[f"api {status}"] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.enqueue_retries[f"api {type(exc).__name__}"] += 1
                if conn_box[0] is not None:
                    conn_box[0].close()
                conn_box[0] = None
            if time.monotonic() > deadline:
                self.enqueue_gave_up.append(f"POST {path}")
                return None
            pause = next_pause(pause)

    def run_workflows(self, groups, spread_seconds: float) -> None:
        """Each group in turn, spread over `spread_seconds`: a batch opened, its members, closed;
        a chain or fan-in's jobs in order (a child is sent once its parents are acknowledged)."""
        box = [None]
        gap = spread_seconds / max(1, len(groups))
        began = time.monotonic()
        for group in groups:
            started = time.monotonic()
            if group.batch:
                callbacks = {f"on_{kind}": "soak_callback" for kind in ("success", "failure", "complete")}
                opened = self.batch_call("/api/batches", {"key": group.batch, **callbacks}, box)
                with self.lock:
                    self.batches_opened[group.batch] = opened is not None
            for spec, payload in group.jobs:
                if any(parent not in self.acked for parent in spec.after):
                    self.enqueue_rejected.append(f"{spec.task_key}: a parent was never acknowledged")
                    continue
                self.record_ack(spec, *self.enqueue_api(spec, payload, 0.0, box))
            if group.batch:
                closed = self.batch_call(f"/api/batches/{group.batch}/close", {}, box)
                with self.lock:
                    self.batches_closed[group.batch] = closed is not None
            time.sleep(max(0.0, gap - (time.monotonic() - started)))
        if box[0] is not None:
            box[0].close()
        self.note(f"workflows enqueued: {len(groups)} groups in {time.monotonic() - began:.1f} s")

    def run_enqueuers(self, jobs: list[tuple[Spec, dict, float]], groups=()) -> list[threading.Thread]:
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
        if groups:
            for group in groups:
                for spec, payload in group.jobs:
                    self.specs[spec.task_key] = spec
                    self.payloads[spec.task_key] = (payload, 0.0)
            spread = self.plan.fault_seconds * 0.6
            threads.append(
                threading.Thread(
                    target=self.guarded(lambda: self.run_workflows(groups, spread)), name="workflows", daemon=True
                )
            )
        for t in threads:
            t.start()
        return threads

    def enqueue_again(self, key: str, n: int, via_api: bool, box: list) -> tuple[str, dict | None]:
        spec = self.specs[key]
        payload, delay = self.payloads[key]
        if via_api:
            return self.enqueue_api(spec, payload, delay, box)
        return self.enqueue_cli(spec, payload, delay)
