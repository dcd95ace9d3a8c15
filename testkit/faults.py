"""What the soak and the drill share: the processes they hit, the seeded fault schedule run in real
time, what the enqueuers were told, and the monitor's view of every row.

A harness subclasses `FaultRun`, names its faults in FAULT_KINDS, and writes one method per
fault, `fault_<kind>(later)`: it injects the fault, raises `NotNow` when its moment has not
come (tried again a second later, up to 15 times), and schedules its end with
`later(seconds, fn)`, so durational faults end from the same loop that starts the next ones.
"""

from __future__ import annotations

import heapq
import http.client
import json
import os
import random
import re
import secrets
import signal
import subprocess
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from testkit.procs import REPO

NOT_NOW_TRIES = 15


class NotNow(Exception):
    """A fault cannot be injected at this moment (say, every worker is still starting): try again
    a second later, a few times."""


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.pid = self.proc.pid
        self.fate = "running"  # running | killed | terminated | stopped-then-continued | exited
        self.stopped = False
        self.sigterm_sent = False
        self._started = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def started(self) -> bool:
        """The worker logged worker_started: its signal handlers are in place."""
        if not self._started:
            with open(self.log_path, "rb") as f:
                self._started = b"event=worker_started " in f.read()
        return self._started

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def sigterm(self) -> None:
        """One SIGTERM. A second one could land while the interpreter is finalising, after Python
        has put the default handlers back, and kill a process that had already stopped cleanly."""
        if self.alive() and not self.sigterm_sent:
            self.sigterm_sent = True
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float) -> int | None:
        self.sigterm()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None
        finally:
            self._log.close()

    def close_log(self) -> None:
        if not self._log.closed:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def gunicorn_children(master_pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def http_json(
    conn: http.client.HTTPConnection, token: str, method: str, path: str, body: dict | None
) -> tuple[int, dict]:
    """One request with the API token: (status, the answer's JSON, or its first bytes as "raw")."""
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    try:
        return resp.status, (json.loads(raw) if raw else {})
    except ValueError:
        return resp.status, {"raw": raw[:200].decode(errors="replace")}


def close_quietly(conn) -> None:
    """Close a connection that may already be broken (a killed session, a restarted server)."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


def next_pause(pause: float) -> float:
    """Sleep a jittered `pause` before the next try of an enqueue; the pause after it."""
    time.sleep(pause * random.uniform(0.5, 1.5))
    return min(pause * 2, 2.0)


def count_events(paths: list[Path], names: tuple[str, ...]) -> Counter:
    """How many `event=<name>` lines and tracebacks the processes' logs hold."""
    counts: Counter = Counter()
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in names:
            counts[name] += len(re.findall(rf"event={name} ", text))
        counts["Traceback"] += text.count("Traceback (most recent call last)")
    return counts


@dataclass
class Outcome:
    passed: bool
    verdict: str
    table: str
    numbers: dict = field(default_factory=dict)


class FaultRun:
    """The state a fault-injection run keeps, and the loop that runs its schedule."""

    FAULT_KINDS: tuple[str, ...] = ()
    TERMINAL = ("done", "failed", "cancelled")

    def __init__(self, plan, seed: int, workdir: Path, say=print):
        self.plan = plan
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.say = say
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.exec_log = workdir / "executions.log"
        self.exec_log.write_text("")
        self.token = secrets.token_urlsafe(32)
        self.lock = threading.Lock()
        self.t0 = 0.0
        # What the enqueuers learned.
        self.specs: dict = {}
        self.payloads: dict = {}
        self.acked: dict[str, int] = {}
        # Fresh keys whose acknowledgement said duplicate: true: an earlier try had committed and
        # its answer was lost (a 503, a killed gunicorn worker: after a client retry), or the
        # server's own retry after a COMMIT whose OK never arrived (in one request).
        self.fresh_duplicates: Counter = Counter()
        self.enqueue_retries: Counter = Counter()
        self.enqueue_gave_up: list[str] = []
        self.enqueue_rejected: list[str] = []
        self.replayed = 0
        self.replay_mismatches: list[str] = []
        # What the faults did.
        self.faults: Counter = Counter()
        self.fault_errors: list[str] = []
        self.fault_log: list[str] = []
        self.killed_pids: set[int] = set()
        self.partitioned_pids: set[int] = set()
        self.unexpected_exits: list[str] = []
        self.action_threads: list[threading.Thread] = []  # replays, cancels, resumes
        # The monitor's view.
        self.monitor_stop = threading.Event()
        self.last_seen: dict[int, tuple[int, str]] = {}
        self.attempts_backwards: list[dict] = []
        self.terminal_regressions: list[dict] = []
        self.monitor_samples = 0
        self.status_counts: Counter = Counter()

    # --- what the harness says for itself --------------------------------------------------------

    def check_unexpected_exits(self) -> None:
        raise NotImplementedError

    def progress_suffix(self) -> str:
        return ""

    def enqueue_again(self, key: str, n: int, via_api: bool, box: list) -> tuple[str, dict | None]:
        """Enqueue a known task_key again (fault_replay), through the API or the CLI."""
        raise NotImplementedError

    # --- bookkeeping -----------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.fault_log.append(f"{time.monotonic() - self.t0:7.1f}s {text}")

    def guarded(self, fn):
        """`fn` for a thread of the harness: a crash is reported (and fails the run), not lost."""

        def run():
            try:
                fn()
            except Exception:
                self.fault_errors.append(f"thread {threading.current_thread().name} crashed:\n{traceback.format_exc()}")

        return run

    def spawn(self, fn, name: str) -> threading.Thread:
        """An action that outlives its moment in the fault loop (a replay, a cancel, a resume)."""
        t = threading.Thread(target=self.guarded(fn), name=name, daemon=True)
        t.start()
        self.action_threads.append(t)
        return t

    def record_ack(self, spec, outcome: str, answer: dict | None) -> None:
        with self.lock:
            if outcome == "ok":
                self.acked[spec.task_key] = int(answer["id"])
                if answer.get("duplicate"):
                    self.fresh_duplicates[
                        "after a client retry" if answer.get("_tries", 1) > 1 else "in one request"
                    ] += 1
            elif outcome == "rejected":
                self.enqueue_rejected.append(f"{spec.task_key} via {spec.via}: {answer}")
            else:
                self.enqueue_gave_up.append(f"{spec.task_key} via {spec.via}")

    def watch(self, job_id: int, attempts: int, status: str) -> tuple[int, str] | None:
        """The monitor's check of one row: attempts never go down and a finished job stays so
        (only an operator's cancel turns failed into cancelled). What was seen before."""
        before = self.last_seen.get(job_id)
        if before is not None:
            if attempts < before[0]:
                self.attempts_backwards.append({"id": job_id, "from": before[0], "to": attempts})
            if (
                before[1] in self.TERMINAL
                and status != before[1]
                and not (before[1] == "failed" and status == "cancelled")
            ):
                self.terminal_regressions.append({"id": job_id, "from": before[1], "to": status})
        self.last_seen[job_id] = (attempts, status)
        return before

    def progress(self) -> None:
        c = self.status_counts
        self.say(
            f"[{time.monotonic() - self.t0:6.1f}s] acked {len(self.acked)}/{len(self.specs)}  "
            + " ".join(f"{s} {c.get(s, 0)}" for s in ("ready", "scheduled", "running", "done", "failed"))
            + f"  faults {sum(v for k, v in self.faults.items() if k in self.FAULT_KINDS)}"
            + self.progress_suffix()
        )

    # --- the schedule ----------------------------------------------------------------------------

    def announce(self, name: str, schedule: list[tuple[float, str]], window: float) -> None:
        """schedule.json in the workdir, and the run's first line."""
        (self.workdir / "schedule.json").write_text(
            json.dumps([{"at": round(t, 2), "fault": k} for t, k in schedule], indent=1)
        )
        self.say(
            f"{name}: {self.plan.jobs} jobs, seed {self.seed}, {len(schedule)} scheduled faults over {window:g} s; "
            f"logs in {self.workdir}"
        )

    def run_faults(
        self, schedule: list[tuple[float, str]], start: float | None = None, with_traceback: bool = False
    ) -> None:
        """Run the schedule (seconds after `start`, fault kind) in real time; durational faults
        (stops, holds, cut links) end from the same loop."""
        start = time.monotonic() if start is None else start
        heap: list[tuple[float, int, str, object]] = []
        seq = 0
        for at, kind in schedule:
            heap.append((start + at, seq, kind, 0))
            seq += 1
        heapq.heapify(heap)

        def later(seconds: float, fn) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (time.monotonic() + seconds, seq, "end", fn))

        last_progress = 0.0
        while heap:
            when, _, kind, fn = heap[0]
            now = time.monotonic()
            if now - last_progress >= 5:
                last_progress = now
                self.progress()
            if when > now:
                time.sleep(min(0.2, when - now))
                self.check_unexpected_exits()
                continue
            heapq.heappop(heap)
            try:
                if kind == "end":
                    fn()
                else:
                    getattr(self, f"fault_{kind}")(later)
                    self.faults[kind] += 1
            except NotNow as exc:
                if fn < NOT_NOW_TRIES:
                    seq += 1
                    heapq.heappush(heap, (time.monotonic() + 1.0, seq, kind, fn + 1))
                    continue
                self.fault_errors.append(f"{kind}: {exc} ({NOT_NOW_TRIES} tries)")
                self.note(f"{kind} not injected: {exc}")
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.fault_errors.append(
                    f"{kind}: {type(exc).__name__}: {exc}" + (f"\n{traceback.format_exc()}" if with_traceback else "")
                )
                self.note(f"{kind} not injected: {exc}")
            self.check_unexpected_exits()

    def fault_replay(self, later) -> None:
        """Enqueue a sample of acknowledged task_keys again, through both doors: each must answer
        duplicate with the job's id."""
        with self.lock:
            known = sorted(self.acked.items())
        n_api, n_cli = self.plan.replay_api_keys, self.plan.replay_cli_keys
        if len(known) < n_api + n_cli:
            raise NotNow("too few acknowledged keys to replay yet")
        sample = self.rng.sample(known, n_api + n_cli)

        def replay():
            box = [None]
            for n, (key, job_id) in enumerate(sample):
                outcome, answer = self.enqueue_again(key, n, n < n_api, box)
                with self.lock:
                    self.replayed += 1
                    if outcome != "ok" or not answer.get("duplicate") or int(answer["id"]) != job_id:
                        self.replay_mismatches.append(f"{key} (id {job_id}): {outcome} {answer}")
            if box[0] is not None:
                box[0].close()

        self.spawn(replay, "replay")
        self.note(f"replaying {n_api} task_keys via the API and {n_cli} via the CLI")

    # --- the end ---------------------------------------------------------------------------------

    def wait_drained(self, connect, enqueued: threading.Event) -> bool:
        """Until the enqueuers are done and no job is ready, running or scheduled (read through
        `connect()`), for up to plan.drain_timeout."""
        import pymysql

        deadline = time.monotonic() + self.plan.drain_timeout
        last_progress = 0.0
        while time.monotonic() < deadline:
            self.check_unexpected_exits()
            if time.monotonic() - last_progress >= 5:
                last_progress = time.monotonic()
                self.progress()
            try:
                conn = connect()
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT COUNT(*) FROM job_queue WHERE status IN ('ready', 'running', 'scheduled')")
                        open_jobs = cur.fetchone()[0]
                finally:
                    conn.close()
            except pymysql.MySQLError:
                open_jobs = -1
            if open_jobs == 0 and enqueued.is_set():
                return True
            time.sleep(0.5)
        return False

    def common_numbers(self, findings, load_before: float) -> dict:
        """The figures every run reports the same way (results.json)."""
        violations = findings.violations()
        return {
            "jobs_api": sum(1 for s in self.specs.values() if s.via == "api"),
            "jobs_cli": sum(1 for s in self.specs.values() if s.via == "cli"),
            "acked": len(self.acked),
            "by_kind": {k: dict(v) for k, v in sorted(findings.by_kind.items())},
            "faults": {k: self.faults.get(k, 0) for k in self.FAULT_KINDS},
            "replayed_keys": self.replayed,
            "fault_errors": self.fault_errors,
            "lost": findings.get("lost"),
            "duplicate_results": findings.get("duplicate_results"),
            "duplicate_executions": findings.get("duplicate_executions"),
            "extra_executions": findings.get("extra_executions"),
            "duplicate_causes": dict(findings.duplicate_causes.most_common()),
            "executions": findings.get("executions"),
            "attempts_backwards": findings.get("attempts_backwards"),
            "failed_not_doomed": findings.get("failed_not_doomed"),
            "unexpected_failure_reasons": dict(findings.unexpected_failures.most_common(5)),
            "monitor_samples": self.monitor_samples,
            "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "enqueue_retries": dict(self.enqueue_retries),
            "fresh_keys_acknowledged_as_duplicate": dict(self.fresh_duplicates),
            "violations": violations,
            "examples": {k: v for k, v in findings.examples.items() if k in violations},
        }

    def conclude(self, name: str, summary: str, problems: dict, numbers: dict, table) -> Outcome:
        """The verdict line (`<name> PASS: <summary>`), results.json and faults.log in the workdir."""
        passed = not problems
        verdict = f"{name} {'PASS' if passed else 'FAIL'}: {summary}" + (
            "" if passed else f"; problems: {', '.join(f'{k}={v}' for k, v in problems.items())}"
        )
        (self.workdir / "results.json").write_text(
            json.dumps({"verdict": verdict, "passed": passed, **numbers}, indent=1, default=str)
        )
        (self.workdir / "faults.log").write_text("\n".join(self.fault_log) + "\n")
        return Outcome(passed, verdict, table(numbers), numbers)

    def common_problems(
        self, findings, drained: bool, codes: dict, schedule: list[tuple[float, str]]
    ) -> tuple[dict, dict, list[str]]:
        """The problems every run judges the same way: (problems, non-zero exit codes, faults
        scheduled but never injected)."""
        problems = dict(findings.violations())
        if not drained:
            problems["drain_timed_out"] = 1
        for name, items in (
            ("enqueue_gave_up", self.enqueue_gave_up),
            ("enqueue_rejected", self.enqueue_rejected),
            ("replay_mismatches", self.replay_mismatches),
            ("unexpected_exits", self.unexpected_exits),
        ):
            if items:
                problems[name] = len(items)
        bad_codes = {k: v for k, v in codes.items() if v != 0}
        if bad_codes:
            problems["nonzero_exit_codes"] = len(bad_codes)
        missing = [k for k in self.FAULT_KINDS if self.faults.get(k, 0) == 0 and any(kind == k for _, kind in schedule)]
        if missing:
            problems["faults_not_injected"] = len(missing)
        crashed = [e for e in self.fault_errors if "crashed" in e]
        if crashed:
            problems["harness_thread_crashed"] = len(crashed)
        return problems, bad_codes, missing


def seed_and_workdir(seed: int | None, workdir: str | None, name: str) -> tuple[int, Path]:
    """The seed given or a random one; the workdir given or test-artifacts/<name>-<time>, made."""
    from datetime import datetime

    seed = seed if seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    path = Path(workdir or REPO / "test-artifacts" / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    return seed, path


def rerun_command(prog: str, given: list[str], seed: int) -> str:
    """The command that runs this again: the arguments given, with the seed it used."""
    return " ".join([prog, *given] + ([] if "--seed" in given else ["--seed", str(seed)]))
