"""The drill's enqueuers: jobs due at a steady pace over the window, most through `POST /api/jobs`
on the hosts in turn, some through `jobqueue enqueue` run on a host; each retried with the same
task_key on 5xx, connection errors and exit 1/75, on the next host when one does not answer."""

from __future__ import annotations

import http.client
import json
import queue as queue_mod
import sys
import threading
import time

from drill.topology import run_in
from soak.checks import Spec
from testkit.faults import http_json, next_pause


class Enqueuers:
    """The enqueue half of `Drill` (drill/run.py): its hosts, token and records."""

    def enqueue_api(
        self, spec: Spec, payload: dict, start_host: int, deadline_s: float = 240
    ) -> tuple[str, dict | None]:
        """POST until a host answers 200/201, the same task_key on every try; on a host that does
        not answer, the next host (what a load balancer does)."""
        body = {"task": "soak", "task_key": spec.task_key, "payload": payload, "max_attempts": spec.max_attempts}
        deadline = time.monotonic() + deadline_s
        pause, tries, h = 0.1, 0, start_host
        while True:
            tries += 1
            host = self.hosts[h % len(self.hosts)]
            conn = http.client.HTTPConnection(host.address, 8000, timeout=8)
            try:
                sent = time.time()
                status, answer = http_json(conn, self.token, "POST", "/api/jobs", body)
                if status in (200, 201):
                    answer["_sent"] = sent
                    answer["_tries"] = tries
                    answer["_host"] = host.name
                    return "ok", answer
                if 400 <= status < 500:
                    return "rejected", {"status": status, **answer}
                self.enqueue_retries[f"api {status}"] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.enqueue_retries[f"api {type(exc).__name__}"] += 1
                h += 1
            finally:
                conn.close()
            if time.monotonic() > deadline:
                return "gave_up", None
            pause = next_pause(pause)

    def enqueue_cli(
        self, spec: Spec, payload: dict, start_host: int, deadline_s: float = 240
    ) -> tuple[str, dict | None]:
        """`jobqueue enqueue` on a host, with the candidate URLs; exit 1 (database) or 75 (no
        writable primary) is tried again, on the next host after a timeout or exit 1."""
        argv = [
            sys.executable,
            "-m",
            "jobqueue.cli",
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
        ]
        deadline = time.monotonic() + deadline_s
        pause, tries, h = 0.2, 0, start_host
        while True:
            tries += 1
            host = self.hosts[h % len(self.hosts)]
            try:
                sent = time.time()
                out = run_in(host.prefix, argv, host.env, timeout=45)
            except Exception as exc:  # subprocess.TimeoutExpired
                self.enqueue_retries[f"cli {type(exc).__name__}"] += 1
                h += 1
            else:
                if out.returncode == 0:
                    answer = json.loads(out.stdout.strip().splitlines()[-1])
                    answer["_sent"] = sent
                    answer["_tries"] = tries
                    answer["_host"] = host.name
                    return "ok", answer
                if out.returncode not in (1, 75):
                    return "rejected", {"code": out.returncode, "stderr": out.stderr[-500:]}
                self.enqueue_retries[f"cli exit {out.returncode}"] += 1
                if out.returncode == 1:
                    h += 1
            if time.monotonic() > deadline:
                return "gave_up", None
            pause = next_pause(pause)

    def record_ack(self, spec: Spec, outcome: str, answer: dict | None) -> None:
        super().record_ack(spec, outcome, answer)
        if outcome == "ok":
            self.ack_times.append((answer["_sent"], time.time()))

    def enqueue_again(self, key: str, n: int, via_api: bool, box: list) -> tuple[str, dict | None]:
        return (self.enqueue_api if via_api else self.enqueue_cli)(self.specs[key], self.payloads[key], n)

    def run_enqueuers(self, jobs: list[tuple[Spec, dict]]) -> list[threading.Thread]:
        """Job i is due at i * pace: the enqueues span the window, failover included."""
        pace = self.plan.window_seconds * 0.9 / max(1, len(jobs))
        api_q: queue_mod.Queue = queue_mod.Queue()
        cli_q: queue_mod.Queue = queue_mod.Queue()
        for i, (spec, payload) in enumerate(jobs):
            self.specs[spec.task_key] = spec
            self.payloads[spec.task_key] = payload
            (cli_q if spec.via == "cli" else api_q).put((self.t0 + i * pace, spec, payload))

        def loop(q: queue_mod.Queue, enqueue, home: int):
            while True:
                try:
                    due, spec, payload = q.get_nowait()
                except queue_mod.Empty:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.record_ack(spec, *enqueue(spec, payload, home))

        threads = []
        for h in range(len(self.hosts)):
            for n in range(self.plan.api_threads_per_host):
                threads.append(
                    threading.Thread(
                        target=self.guarded(lambda h=h: loop(api_q, self.enqueue_api, h)),
                        name=f"api-{h}-{n}",
                        daemon=True,
                    )
                )
            for n in range(self.plan.cli_threads_per_host):
                threads.append(
                    threading.Thread(
                        target=self.guarded(lambda h=h: loop(cli_q, self.enqueue_cli, h)),
                        name=f"cli-{h}-{n}",
                        daemon=True,
                    )
                )
        for t in threads:
            t.start()
        return threads
