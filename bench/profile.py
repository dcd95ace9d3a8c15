"""Where our worker's time goes: py-spy on `jobqueue worker --concurrency 4` over the N-job run.

py-spy attaches to the worker while it waits at the start gate, then the gate opens, so start-up
is not in the profile (samples still at the gate are dropped). Three recordings, each its own run
on a fresh database:

- `--gil`: only the thread holding the GIL, i.e. what the interpreter's one core is spent on.
  Attributed by layer (the innermost frame that is PyMySQL, SQLAlchemy, our code, ...), and the
  GIL-held share of the run (near 100% means the process is CPU-bound on the interpreter).
- `--idle`: every thread at every sample, so each thread's time splits into waiting for the
  server (socket reads), idle (waiting on an Event/Condition/queue or sleeping) and runnable
  (running Python or waiting for the GIL).
- a flamegraph SVG of the `--gil` view: docs/bench/profile-worker-c4.svg.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import log

# "func (file:line)"; the file may itself hold parentheses ("<sqlalchemy generated _generative()
# wrapper ...>"), function names hold no spaces.
FRAME = re.compile(r"^(?P<func>\S+) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
LAYERS = [
    ("PyMySQL", ("pymysql/",)),
    ("SQLAlchemy", ("sqlalchemy/", "<sqlalchemy")),
    ("prometheus_client", ("prometheus_client/",)),
    ("our code (jobqueue/core)", ("jobqueue/core/",)),
]


def pyspy() -> str:
    exe = Path(sys.executable).with_name("py-spy")
    return str(exe) if exe.exists() else "py-spy"


def record(jobs: int, log_dir: Path, out: Path, flags: list[str], fmt: str, rate: int = 100) -> dict[str, Any]:
    with common.mysql_db("spy") as url:
        common.enqueue_noops(url, jobs)
        spies: list[subprocess.Popen] = []

        def attach(pids: list[int]) -> None:
            spies.append(
                subprocess.Popen(
                    [
                        pyspy(),
                        "record",
                        "--pid",
                        str(pids[0]),
                        "--rate",
                        str(rate),
                        "--format",
                        fmt,
                        "-o",
                        str(out),
                        *flags,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            time.sleep(1.5)  # py-spy attached and sampling before the gate opens

        run = common.ProcRun([common.worker_cmd(url, 4)])
        run.start(log_dir, before_open=attach)
        run.wait(max(180.0, jobs / 20))
        run.check()
        rc = spies[0].wait(60)
        err = spies[0].stderr.read()
        if rc != 0 or not out.exists():
            raise RuntimeError(f"py-spy failed ({rc}): {err[-1000:]}")
        win = common.db_window(url)
    return {"jobs_per_s": win.jobs_per_s, "window_s": win.seconds, "rate": rate}


def parse_raw(path: Path) -> list[tuple[str, list[tuple[str, str, str]], int]]:
    """py-spy raw output: 'thread (tid): name;frame;frame count' -> (thread name, frames, count);
    a frame is (function, file, line)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        thread = parts[0]
        m = re.match(r"thread \((?:0x)?[0-9A-Fa-f]+\)(?:: (.*))?", thread)
        name = (m.group(1) or "?") if m else thread
        frames = []
        for fr in parts[1:]:
            fm = FRAME.match(fr)
            frames.append((fm.group("func"), fm.group("file"), fm.group("line") or "") if fm else (fr, "", ""))
        out.append((name, frames, int(count)))
    return out


def _at_gate(frames) -> bool:
    return any("bench/gate" in f for _, f, _ in frames)


def layer_of(frames) -> str:
    for _func, file, _ in reversed(frames):  # innermost first
        for name, keys in LAYERS:
            if any(file.startswith(k) or k in file for k in keys):
                return name
    return "interpreter / thread start-up"


def role_of(thread: str) -> str:
    if thread.startswith("jobqueue-slot"):
        return "slot threads (run handler, complete)"
    if thread.startswith("jobqueue-renewer"):
        return "lease renewer"
    if thread == "MainThread":
        return "claim loop (main thread)"
    return "other"


def state_of(frames) -> str:
    """Without native frames a thread blocked in C shows its innermost Python frame: a socket read
    is SocketIO.readinto (socket.py), a lock/Event/Condition/queue wait is Condition.wait or
    Lock.acquire under threading.py / queue.py."""
    func, file, _ = frames[-1] if frames else ("", "", "")
    if file.startswith("socket.py") and "readinto" in func:
        return "waiting for MariaDB (socket read)"
    if file.startswith(("threading.py", "queue.py")):
        return "idle (Event/Condition/queue wait)"
    return "runnable (running Python or waiting for the GIL)"


def our_call(frames) -> str:
    """What the innermost frame of our code was calling when the sample was taken."""
    idx = max((i for i, (_, f, _) in enumerate(frames) if f.startswith("jobqueue/core/")), default=None)
    if idx is None:
        return "no frame of ours (thread start-up)"
    if idx == len(frames) - 1:
        return "our own Python"
    func, file, _ = frames[idx + 1]
    if file == "<string>":  # dataclass-generated __init__ of our models
        return "our own Python"
    if file.startswith("sqlalchemy/sql/") or file.startswith("<sqlalchemy"):
        return "building SQLAlchemy Core statements"
    if file.startswith(("sqlalchemy/engine/", "sqlalchemy/pool/", "sqlalchemy/")):
        return "executing via SQLAlchemy (engine, results, commit, pool; PyMySQL under it)"
    if file.startswith("pymysql/"):
        return "PyMySQL called directly"
    if file.startswith("prometheus_client/"):
        return "prometheus_client (metrics)"
    if file.startswith("logging/"):
        return "logging"
    if file.startswith(("threading.py", "queue.py")):
        return "thread hand-off (Condition/Event/queue)"
    return f"other ({file.split('/')[0]})"


def analyse_gil(path: Path, window_s: float, rate: int) -> dict[str, Any]:
    parsed = parse_raw(path)
    # No Python frame at all: the main thread in interpreter shutdown after the last job.
    empty = sum(c for _, frames, c in parsed if not frames)
    stacks = [s for s in parsed if s[1] and not _at_gate(s[1])]
    total = sum(c for _, _, c in stacks)
    layers = collections.Counter()
    selfs = collections.Counter()
    ours_incl = collections.Counter()
    sa_incl = collections.Counter()
    calls = collections.Counter()
    repo_lines = collections.Counter()
    for _thread, frames, c in stacks:
        layers[layer_of(frames)] += c
        calls[our_call(frames)] += c
        for func, file, line in frames:
            if file.startswith("jobqueue/core/repository.py") and "<locals>" in func:
                repo_lines[f"{func} (repository.py:{line})"] += c
                break
        if frames:
            func, file, _ = frames[-1]
            selfs[f"{func} ({file})"] += c
        seen = set()
        for func, file, _ in frames:
            key = f"{func} ({file})"
            if file.startswith("jobqueue/core/") and key not in seen:
                ours_incl[key] += c
                seen.add(key)
        for _func, file, _ in frames:
            if file.startswith("sqlalchemy/") or file.startswith("<sqlalchemy"):
                sa_incl[_sa_area(file)] += c
                break
    return {
        "samples": total,
        "samples_without_python_frames": empty,
        "gil_busy_share": total / (window_s * rate) if window_s else float("nan"),
        "layers": {k: v / total for k, v in layers.most_common()},
        "our_calls": {k: v / total for k, v in calls.most_common()},
        "repository_lines": [(k, v / total) for k, v in repo_lines.most_common(12)],
        "top_self": [(k, v / total) for k, v in selfs.most_common(15)],
        "top_ours_inclusive": [(k, v / total) for k, v in ours_incl.most_common(15)],
        "sqlalchemy_entry_areas": {k: v / total for k, v in sa_incl.most_common(8)},
    }


def _sa_area(file: str) -> str:
    if file.startswith("<sqlalchemy"):
        return "sqlalchemy/sql (statement construction)"
    parts = file.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else file


def analyse_idle(path: Path) -> dict[str, Any]:
    stacks = [s for s in parse_raw(path) if s[1] and not _at_gate(s[1])]
    by_role: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    threads: dict[str, set] = collections.defaultdict(set)
    for thread, frames, c in stacks:
        role = role_of(thread)
        by_role[role][state_of(frames)] += c
        threads[role].add(thread)
    out = {}
    for role, counter in by_role.items():
        total = sum(counter.values())
        out[role] = {
            "threads": len(threads[role]),
            "samples": total,
            "states": {k: v / total for k, v in counter.most_common()},
        }
    return out


def run(ctx) -> dict[str, Any]:
    bench_dir = ctx.out_dir / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    gil_raw = bench_dir / "profile-worker-c4-gil.txt"
    idle_raw = bench_dir / "profile-worker-c4-idle.txt"
    svg = bench_dir / "profile-worker-c4.svg"
    log("profile: py-spy --gil (raw)")
    g = record(ctx.jobs, ctx.log_dir, gil_raw, ["--gil", "--threads"], "raw")
    log("profile: py-spy --idle (raw)")
    i = record(ctx.jobs, ctx.log_dir, idle_raw, ["--idle", "--threads"], "raw")
    log("profile: py-spy --gil (flamegraph)")
    s = record(ctx.jobs, ctx.log_dir, svg, ["--gil"], "flamegraph")
    gil = analyse_gil(gil_raw, g["window_s"], g["rate"])
    idle = analyse_idle(idle_raw)
    return {
        "jobs": ctx.jobs,
        "concurrency": 4,
        "runs": {"gil": g, "idle": i, "svg": s},
        "gil": gil,
        "idle": idle,
        "files": {"gil_raw": gil_raw.name, "idle_raw": idle_raw.name, "svg": svg.name},
    }
