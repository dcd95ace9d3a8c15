"""The benchmark report's sections on the dashboard, start-up and batch enqueue."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report_format import n0, table, verdict


def _dashboard(r: dict, targets: list) -> str:
    for name, p in r["pages"].items():
        targets.append(
            (f"6. dashboard p95 < 150 ms with {n0(r['rows'])} rows: {name}", f"{p['p95_ms']:.0f} ms", p["pass"])
        )
    b = r["bulk"]
    plan = r["claim_plan"][0] if r.get("claim_plan") else {}
    return "\n\n".join(
        [
            f"`job_queue` holds {n0(r['rows'])} rows (loaded in {r['load_s']:.0f} s: a week of done jobs over 5 queues, "
            "1 in 19 failed, then 40,000 ready, 9,000 scheduled, 1,000 running), plus 5,000 audit entries, 4 worker processes and 15 minutes of activity. Pages are "
            f"fetched over HTTP from the app under gunicorn (1 process), signed in; {r['rounds']} rounds per page after a "
            "warm-up.",
            table(
                ["page", "path", "p50 ms", "p95 ms", "max ms", "p95 < 150 ms"],
                [
                    [
                        name,
                        f"`{p['path'] if len(p['path']) <= 60 else p['path'][:57] + '...'}`",
                        f"{p['p50_ms']:.1f}",
                        f"{p['p95_ms']:.1f}",
                        f"{p['max_ms']:.1f}",
                        verdict(p["pass"]),
                    ]
                    for name, p in r["pages"].items()
                ],
            ),
            f'**Bulk requeue** of {n0(b["jobs"])} failed jobs (`service.bulk_action`, what "every job matching the '
            f'filter" runs; batches of 500, each its own short transaction with SKIP LOCKED): {b["seconds"]:.1f} s, '
            f"**{n0(b['jobs_per_s'])} jobs/s** ({n0(b['busy'])} busy, {n0(b['skipped'])} skipped). A 4-thread worker on "
            f"another queue meanwhile: {n0(r['worker_during_bulk_jobs_per_s'])} jobs/s, against "
            f"{n0(r['worker_alone_jobs_per_s'])} jobs/s alone just before (**{r['worker_ratio']:.2f}x**).",
            f"The claim's plan at this size: key `{plan.get('key')}`, type `{plan.get('type')}`, Extra "
            f"`{plan.get('Extra')}`.",
            *([_search(r["search"])] if r.get("search") else []),
        ]
    )


def _search(s: dict) -> str:
    """Search by a bounded scan (what the dashboard does) against a FULLTEXT index."""
    b, f = s["bounded"], s["fulltext"]

    def ft(name: str) -> list[str]:
        x = f.get(name, {})
        if x.get("timed_out_s"):
            return [f"over {x['timed_out_s']} s (stopped)", "", "n/a"]
        return [f"{x.get('p50_ms', float('nan')):.1f}", f"{x.get('p95_ms', float('nan')):.1f}", n0(x.get("found"))]

    rows = []
    for name, label in (("common", "common term"), ("rare", "rare term"), ("errors", "in failed jobs' errors")):
        x = b[name]
        rows.append(
            [
                f"{label} `{x['term']}`",
                f"{x['p50_ms']:.1f}",
                f"{x['p95_ms']:.1f}",
                f"{n0(x['found'])} ({n0(x['matches'])}{'+' if x['capped'] else ''} in the window)",
                *ft(name),
            ]
        )
    cs = b.get("rare_case_sensitive")
    e = s["enqueue_jobs_per_s"]
    return "\n\n".join(
        [
            f"**Search**, measured in the repository (no HTTP): the bounded scan reads at most the newest "
            f"{n0(s['window'])} rows matching the other filters (one scan gives the page and the capped count); "
            f"FULLTEXT is `MATCH(payload, last_error) AGAINST ('\"term\"' IN BOOLEAN MODE) ORDER BY id DESC LIMIT 51` "
            "over the whole table.",
            table(
                [
                    "search",
                    "bounded p50 ms",
                    "bounded p95 ms",
                    "bounded found (matches)",
                    "FULLTEXT p50 ms",
                    "FULLTEXT p95 ms",
                    "FULLTEXT found",
                ],
                rows,
            ),
            f"Building the FULLTEXT index took {f['build_s']:.0f} s; with it, batch enqueue ran "
            f"{n0(e['with_fulltext'])} jobs/s against {n0(e['without_fulltext'])} without "
            f"(**{e['with_fulltext'] / e['without_fulltext']:.2f}x**). A FULLTEXT query for a substring (`eedle`) "
            f"found {n0(f.get('substring_found'))} rows; the scan finds substrings. "
            + (
                f"Ignoring case (COLLATE utf8mb4_general_ci) costs the scan {b['rare']['p50_ms']:.1f} ms against "
                f"{cs['p50_ms']:.1f} ms compared byte for byte (p50, rare term)."
                if cs
                else ""
            ),
        ]
    )


def _startup(r: dict, targets: list) -> str:
    m, t = r["median"], r["targets"]
    targets.append(
        (
            '8. `jobqueue enqueue` <= 1.5x `python -c "import sqlalchemy, pymysql"`',
            f"{r['enqueue_vs_floor']:.2f}x",
            r["enqueue_vs_floor"] <= t["enqueue_vs_floor_max"],
        )
    )
    targets.append(
        (
            "8. an empty `jobqueue worker --burst` run <= 0.6 s",
            f"{m['empty_burst']:.3f} s",
            m["empty_burst"] <= t["empty_burst_max_s"],
        )
    )
    targets.append(
        (
            "8. a worker's first claim <= 0.4 s after its start",
            f"{m['first_claim']:.3f} s",
            m["first_claim"] <= t["first_claim_max_s"],
        )
    )
    return "\n\n".join(
        [
            f"Whole processes, alternating, medians of {r['runs']} runs (bytecode written and reused, as for users); "
            "the first claim is from spawning `jobqueue worker` to the database's `started_at` of a waiting job. "
            "Phases: [bench/startup.md](bench/startup.md).",
            table(
                ["what", "median s"],
                [
                    ['`python -c "import sqlalchemy, pymysql"` (the floor)', f"{m['import_floor']:.3f}"],
                    ["`jobqueue enqueue noop --key ...`", f"{m['enqueue']:.3f}"],
                    ["`jobqueue worker --burst`, empty queue", f"{m['empty_burst']:.3f}"],
                    ["spawn to first claim", f"{m['first_claim']:.3f}"],
                ],
            ),
        ]
    )


def _enqueue(r: dict, targets: list) -> str:
    from bench.enqueue import markdown

    q = r["ratios"]
    if q.get("enqueue_many / pgqueuer") is not None:
        targets.append(
            (
                "9. batch enqueue (enqueue_many) >= 1.0x pgqueuer's, same run",
                f"{q['enqueue_many / pgqueuer']:.2f}x",
                q["enqueue_many / pgqueuer"] >= 1.0,
            )
        )
    net = q.get("enqueue-many process (empty run subtracted) / raw PyMySQL")
    targets.append(
        (
            "9. `jobqueue enqueue-many` (start-up subtracted) >= 1.0x a hand-written multi-row INSERT",
            f"{net:.2f}x" if net else "not measurable",
            bool(net and net >= 1.0),
        )
    )
    worst = max(r["validation_us_per_job"].values())
    targets.append(("9. validation < 5 us per job", f"{worst:.2f} us", worst < 5))
    h = r.get("http_single_enqueue")
    if h:
        targets.append(
            (
                "9. single enqueue through the API, p50 / p95 (reported)",
                f"{h['p50_ms']:.1f} / {h['p95_ms']:.1f} ms",
                None,
            )
        )
    return markdown(r) + "\n\nMore (before/after, where the time goes): [bench/enqueue.md](bench/enqueue.md)."


def _dashboard_at_scale(out_dir: Path, targets: list) -> str:
    """Issue 17's dashboard targets from the standalone runs (python -m bench.dashboard), at their
    largest size: MariaDB 10.11's (dashboard.json), then each other server's beside it
    (dashboard-mysql.json: --server mysql; dashboard-mariadb11.json)."""
    head = "## 10. Dashboard at 5,000,000 rows, with a worker running\n\n"
    path = out_dir / "bench" / "dashboard.json"
    if not path.exists():
        return head + "Not measured: run `python -m bench.dashboard --rows 1000000,5000000`."
    paras = []
    for server, name, flag in (
        ("", "dashboard", ""),
        (" on MySQL", "dashboard-mysql", " --server mysql"),
        (" on MariaDB 11.8", "dashboard-mariadb11", " --server mariadb11"),
    ):
        path = out_dir / "bench" / f"{name}.json"
        if not path.exists():
            continue
        r = max(json.loads(path.read_text()), key=lambda x: int(x["rows"]))
        rows = int(r["rows"])
        slow = []
        for page, w in r["worker"].items():
            i = r["idle"][page]
            if not (w["pass"] and i["pass"]):
                slow.append(f"{page} (p95 {i['p95_ms']:.0f} ms idle, {w['p95_ms']:.0f} with a worker)")
        total = len(r["worker"])
        targets.append(
            (
                f"10. every dashboard page p95 < 150 ms at {n0(rows)} rows, idle and with a worker{server}",
                f"{total - len(slow)} of {total} pages",
                not slow,
            )
        )
        claim = r["claim_jobs_per_s"] / r["claim_empty_jobs_per_s"]
        targets.append(
            (f"10. claim throughput at {n0(rows)} rows >= 0.8x an empty table{server}", f"{claim:.2f}x", claim >= 0.8)
        )
        for label, key in (("idle", "poll_idle"), ("with a worker", "poll_worker")):
            p50 = r[key]["db_ms_p50"]
            targets.append(
                (f"10. overview poll's database time < 20 ms ({label}, p50){server}", f"{p50:.1f} ms", p50 < 20)
            )
        version = f" ({r['run']['server']['version']})" if "run" in r else ""
        paras.append(
            f"{'On' + server[3:] + ': from' if server else 'From'} `python -m bench.dashboard{flag}`{version} "
            "(every page and fragment, "
            f"idle and with a worker; the command, date and every figure are in [bench/{name}.md](bench/{name}.md)). "
            f"At {n0(rows)} rows, {total - len(slow)} of {total} pages have p95 < 150 ms both idle and with a worker; "
            f"claim throughput {claim:.2f}x an empty table. "
            + (("Over the target: " + "; ".join(slow) + ".") if slow else "No page over the target.")
        )
    return head + "\n\n".join(paras)
