"""The soak's operator faults: what an operator does to the queue while it runs. Pause and resume
(also while claims stall in their transaction), cancel, and take back a job a worker prefetched."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time

import pymysql

from jobqueue.core.db import ER_LOCK_WAIT_TIMEOUT
from soak.plan import PAUSE_NOTICE_SECONDS, QUEUE
from testkit.faults import NotNow, Proc
from testkit.procs import REPO


class OperatorFaults:
    """The `fault_<kind>` methods of `Soak` (soak/run.py) that act as an operator would."""

    def _cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "jobqueue.cli", "--database-url", self.url, "--log-level", "WARNING", *args],
            capture_output=True,
            text=True,
            env=self.base_env(),
            cwd=REPO,
            timeout=timeout,
        )

    def _until_ok(self, what: str, attempt, deadline_s: float = 60, *, record: bool = True) -> bool:
        """Call `attempt()` (True when done) until it succeeds, through restarts and killed
        connections; False (and, with `record`, counted as a problem) if it never does."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                if attempt():
                    return True
            except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
                pass
            time.sleep(0.3)
        if record:
            self.actions_gave_up.append(f"{what}: gave up after {deadline_s:g} s")
        return False

    def fault_pause_queue(self, later) -> None:
        """Pause the queue through the API; resume it `pause_seconds` later with `jobqueue resume`.
        From PAUSE_NOTICE_SECONDS after the pause answered until the resume is sent, the monitor
        must see no attempt start."""

        def pause() -> bool:
            status, answer = self._http("POST", f"/api/queues/{QUEUE}/pause", {})
            return status == 200 and answer.get("paused") is True

        # A pause refused for 20 s (the primary read-only, restarting, or cut off by another
        # fault) is not a problem: the fault is tried again later, like any fault whose moment
        # has not come. Only a resume that never goes through is (the queue would stay paused).
        if self._pause_open():
            raise NotNow("another pause is open")
        if not self._until_ok("pause", pause, 20, record=False):
            raise NotNow("the pause did not go through")
        window = [time.monotonic() + PAUSE_NOTICE_SECONDS, float("inf")]
        with self.lock:
            self.pause_windows.append(window)
        self.note(f"paused queue {QUEUE} (API) for {self.plan.pause_seconds:g} s")

        def start_resume():
            # On a thread of its own: the resume may have to wait for the database (read-only,
            # restarting), and the end of that fault is due in this same loop.
            with self.lock:
                window[1] = time.monotonic()
                self.resumes_in_flight += 1
            self.spawn(self._resume, "resume")

        later(self.plan.pause_seconds, start_resume)

    def fault_cancel(self, later) -> None:
        """Cancel a few acknowledged jobs, mostly recent ones (so some are ready, scheduled or
        running), through both doors. A job already done answers 409 / exit 3 and stays done."""
        with self.lock:
            known = sorted(self.acked.items(), key=lambda kv: kv[1])
        n = self.plan.cancel_api_keys + self.plan.cancel_cli_keys
        if len(known) < n * 3:
            raise NotNow("too few acknowledged keys to cancel yet")
        recent = known[-n * 5 :]
        sample = self.rng.sample(recent, n - 2) + self.rng.sample(known[: -n * 5], 2)

        box = [None]  # the API's connection, kept between cancels

        def ask(job_id: int, via_api: bool) -> tuple[str, bool]:
            """One cancel: its outcome's name and whether it answered that it changed the job."""
            if not via_api:
                out = self._cli("cancel", str(job_id), "--reason", "soak")
                outcome = {0: "ok", 3: "done", 75: "busy"}.get(out.returncode, f"exit {out.returncode}")
                return outcome, out.returncode == 0 and json.loads(out.stdout).get("changed")
            if box[0] is None:
                box[0] = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=15)
            try:
                status, answer = self._http("POST", f"/api/jobs/{job_id}/cancel", {"reason": "soak"}, conn=box[0])
            except (OSError, http.client.HTTPException):
                box[0].close()
                box[0] = None
                raise
            outcome = {200: "ok", 409: "done", 423: "busy"}.get(status, f"http {status}")
            return outcome, status == 200 and answer.get("changed")

        def cancel():
            for i, (key, job_id) in enumerate(sample):
                via_api = i < self.plan.cancel_api_keys

                def attempt(key=key, job_id=job_id, via_api=via_api) -> bool:
                    try:
                        outcome, changed = ask(job_id, via_api)
                    except BaseException:
                        with self.lock:
                            self.cancel_unknown.add(key)  # sent; whether it took, no one said
                        raise
                    with self.lock:
                        self.cancel_answers[outcome] += 1
                        if changed:
                            self.cancelled.add(key)
                        elif outcome not in ("done", "busy"):
                            # A 5xx (the server's retries ran out after a COMMIT whose OK was
                            # lost?), or "already cancelled" after one: it may have taken.
                            self.cancel_unknown.add(key)
                    return outcome in ("ok", "done")

                self._until_ok(f"cancel {key}", attempt, 60)
            if box[0] is not None:
                box[0].close()

        self.spawn(cancel, "cancel")
        self.note(f"cancelling {len(sample)} jobs ({self.plan.cancel_api_keys} via the API)")

    def _resume(self) -> None:
        """`jobqueue resume` until it goes through; the caller counted it in resumes_in_flight."""
        try:
            ok = self._until_ok("resume", lambda: self._cli("resume", QUEUE).returncode == 0)
        finally:
            with self.lock:
                self.resumes_in_flight -= 1
        self.note(f"resumed queue {QUEUE} (CLI){'' if ok else ' FAILED'}")

    def _pause_open(self) -> bool:
        """A pause whose resume has not landed (it may wait for the database, or for a claim that
        a stopped worker holds open): another pause now would be ended by that resume."""
        with self.lock:
            return self.resumes_in_flight > 0 or any(w[1] == float("inf") for w in self.pause_windows)

    def fault_take_back_prefetched(self, later) -> None:
        """An operator takes back a job that waits in hand for a thread (issue 25): a worker of its
        own, `--concurrency 1 --prefetch 2`, holds three jobs, the first 12 s long
        (testkit.tasks.record_runs, which writes the wall-clock time its handler starts); while
        the first runs, the second is
        cancelled, failed or force-requeued (in turn) with the CLI. Its first attempt's handler
        must not start after the command answered. Its own database on the soak's server, so
        that the soak's workers and checks never see these jobs."""
        with self.lock:
            if self.take_back_busy:
                raise NotNow("the last round still runs")
            self.take_back_busy = True
        actions = (("cancel",), ("requeue", "--force"), ("fail",))
        action = actions[len(self.take_back_rounds) % len(actions)]
        self.take_back_rounds.append(" ".join(action))
        self.spawn(lambda: self._take_back_round(len(self.take_back_rounds), action), "take-back")
        self.note(f"take back a prefetched job: round {len(self.take_back_rounds)}, `{' '.join(action)}`")

    def _take_back_round(self, n: int, action: tuple[str, ...]) -> None:
        """One round, tried again (each try its own queue) while another fault spoils it (the
        database restarting or read-only), for up to 120 s."""
        deadline = time.monotonic() + 120
        try:
            for attempt in range(1, 100):
                try:
                    self._take_back_once(f"tb{n}-{attempt}", action)
                    with self.lock:
                        self.take_back_done += 1
                    return
                except (
                    RuntimeError,
                    OSError,
                    ValueError,
                    KeyError,
                    subprocess.TimeoutExpired,
                    pymysql.MySQLError,
                ) as exc:
                    self.note(f"take back round {n}, try {attempt} spoilt: {str(exc)[:200]}")
                    if time.monotonic() > deadline:
                        return
                    time.sleep(1.0)
        finally:
            with self.lock:
                self.take_back_busy = False

    def _take_back_once(self, queue: str, action: tuple[str, ...]) -> None:
        folder = self.workdir / "take-back"
        folder.mkdir(exist_ok=True)
        if not self.take_back_url:
            # A database of its own, made from scratch: a restart may have cut the last init-db short.
            self.server.execute("DROP DATABASE IF EXISTS soak_take_back")
            self.take_back_url = self.server.create_database("soak_take_back")
            try:
                self._take_back_cli("init-db", timeout=120)
            except BaseException:
                self.take_back_url = ""
                raise
        ids = []
        for i in range(3):
            # The first runs long enough that the CLI's action lands while it runs, even on a loaded
            # machine (the CLI alone took over 6 s there); the others are short.
            payload = {"seconds": 12 if i == 0 else 1, "log": str(folder / f"{queue}-{i}.log")}
            out = self._take_back_cli(
                "enqueue",
                "record_runs",
                "--key",
                f"{queue}-{i}",
                "--queue",
                queue,
                "--payload",
                json.dumps(payload),
                "--tasks",
                "testkit.tasks",
            )
            ids.append(int(json.loads(out.stdout.strip().splitlines()[-1])["id"]))
        worker = Proc(
            f"take-back-{queue}",
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                self.take_back_url,
                "worker",
                "--name",
                queue,
                "--concurrency",
                "1",
                "--prefetch",
                "2",
                "--queues",
                queue,
                "--tasks",
                "testkit.tasks",
            ],
            self.base_env(),
            self.logs / f"worker-take-back-{queue}.log",
        )

        def starts(i: int) -> list[tuple[int, float]]:
            path = folder / f"{queue}-{i}.log"
            lines = path.read_text().split("\n") if path.exists() else []
            return [(int(p[1]), float(p[3])) for p in (line.split() for line in lines) if p and p[0] == "start"]

        def all_running() -> bool:
            rows = self.server.execute(
                f"SELECT COUNT(*) FROM job_queue WHERE status = 'running' AND id IN ({','.join(map(str, ids))})",
                "soak_take_back",
            )
            return rows[0][0] == 3

        try:
            deadline = time.monotonic() + 30
            while not (starts(0) and all_running()):
                if time.monotonic() > deadline or not worker.alive():
                    raise RuntimeError("the three jobs were not all claimed with the first one started")
                time.sleep(0.1)
            if starts(1):
                raise RuntimeError("the second job started before it could be taken back")
            self._take_back_cli(*action, str(ids[1]))
            answered = time.time()
            deadline = time.monotonic() + 30
            while not starts(2) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            late = [at - answered for attempt, at in starts(1) if attempt == 1 and at >= answered]
            with self.lock:
                if late:
                    self.take_back_late.append(
                        f"queue {queue} `{' '.join(action)}` job {ids[1]}: attempt 1 started "
                        f"{late[0]:.3f} s after the command answered"
                    )
            self.note(f"take back in queue {queue}: {'LATE START' if late else 'no start after the action'}")
        finally:
            code = worker.terminate(30)
            if code == 3 and self.read_only_lately():
                # Refused to start on the read-only server (read_only_flip): the contract; this try
                # was spoilt by it (the jobs were never claimed) and the round tries again.
                self.note(f"take-back worker {worker.name} refused to start on the read-only server (exit 3)")
            elif code != 0:
                self.unexpected_exits.append(f"take-back worker {worker.name} exited with {code}")

    def _take_back_cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "jobqueue.cli",
                "--database-url",
                self.take_back_url,
                "--log-level",
                "WARNING",
                *args,
            ],
            capture_output=True,
            text=True,
            env=self.base_env(),
            cwd=REPO,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"jobqueue {' '.join(args[:2])}: exit {out.returncode}: {out.stderr[-300:]}")
        return out

    def fault_pause_stalled_claim(self, later) -> None:
        """A pause while claims stall inside their transaction (issue 25): the queue's queue_state
        row is held FOR UPDATE, so every claim of the queue waits there, after its worker read
        the queue open; one worker is SIGSTOPped while it waits; the pause is sent (through the
        API) and the hold released; the worker is continued after stop_seconds. The pause answers
        only once that claim committed, and from then on no claim of the queue commits: the
        monitor's pause window (from PAUSE_NOTICE_SECONDS after the answer) must see none."""
        if self._pause_open():
            raise NotNow("another pause is open")
        victims = [w for w in self.live_workers(started=True) if not getattr(w, "proxied", False)]
        if not victims:
            raise NotNow("no started worker to stop")
        hold = self._connect()
        try:
            with hold.cursor() as cur:
                # Another session may hold the row a long while: a worker cut off by a partition
                # in its claim's transaction keeps its lock on the server until the partition
                # heals, and the heal is a `later` of this very thread, which the wait would block
                # (once for 30 s, the read timeout, and the fault went uninjected).
                cur.execute("SET SESSION innodb_lock_wait_timeout = 2")
                cur.execute("BEGIN")
                try:
                    cur.execute("SELECT paused FROM queue_state WHERE queue = %s FOR UPDATE", (QUEUE,))
                except pymysql.MySQLError as exc:
                    if exc.args and exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
                        raise NotNow("the queue_state row is held by another session") from exc
                    raise
                row = cur.fetchone()
                if row is None or row[0]:
                    raise NotNow("no queue_state row to hold yet" if row is None else "the queue is paused")
        except BaseException:
            hold.close()
            raise
        time.sleep(0.5)  # the workers' next claims reach the held row and wait there
        victim = self.rng.choice(victims)
        self.stop_worker(victim)
        window = [float("inf"), float("inf")]
        with self.lock:
            self.pause_windows.append(window)  # open from the answer on, see pause() below

        def pause() -> None:
            def once() -> bool:
                status, answer = self._http("POST", f"/api/queues/{QUEUE}/pause", {}, timeout=30)
                return status == 200 and answer.get("paused") is True

            ok = self._until_ok("pause during a stalled claim", once, 60)
            with self.lock:
                if not ok:
                    window[1] = time.monotonic()  # never opened
                    return
                window[0] = time.monotonic() + PAUSE_NOTICE_SECONDS
            self.note(f"paused queue {QUEUE} during a stalled claim")
            time.sleep(self.plan.pause_seconds)
            with self.lock:
                window[1] = time.monotonic()
                self.resumes_in_flight += 1
            self._resume()

        self.spawn(pause, "stalled-pause")
        time.sleep(0.3)  # the pause is queued behind the hold
        try:
            hold.rollback()
        except pymysql.MySQLError:
            pass  # the session is gone (a restart): its lock went with it
        hold.close()
        self.note(
            f"held the queue_state row of {QUEUE} 0.8 s, SIGSTOP worker {victim.name} (pid {victim.pid}) in "
            f"its claim, paused, released the hold"
        )
        later(self.plan.stop_seconds / 2, lambda: self.continue_worker(victim))
