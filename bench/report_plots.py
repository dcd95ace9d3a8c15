"""The benchmark report's PNG plots (docs/bench/*.png); matplotlib is imported only when one is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report_format import _system_label, n0


class _Pyplot:
    """matplotlib.pyplot, imported when a plot is drawn (the report's text needs no matplotlib)."""

    def __getattr__(self, name: str) -> Any:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot

        return getattr(matplotlib.pyplot, name)


plt = _Pyplot()


def _plot_throughput(r: dict, path: Path) -> None:
    pts = r["points"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(pts))
    ax.bar([x - 0.2 for x in xs], [p["ours_jobs_per_s"] for p in pts], 0.4, label="jobqueue worker")
    ax.bar([x + 0.2 for x in xs], [p["raw_jobs_per_s"] for p in pts], 0.4, label="raw PyMySQL loop (ceiling)")
    for x, p in zip(xs, pts):
        ax.annotate(
            f"{p['ratio']:.2f}x",
            (x, max(p["ours_jobs_per_s"], p["raw_jobs_per_s"])),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(list(xs))
    ax.set_xticklabels([p["point"].replace(" processes x ", " proc x ").replace(", ", "\n") for p in pts], fontsize=7)
    ax.set_ylabel("jobs/s (median)")
    ax.set_title(f"Worker vs raw loop, {r['jobs']} no-op jobs on MariaDB")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_peers(s: dict, path: Path) -> None:
    keys = list(s)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    ys = range(len(keys))
    colors = ["tab:blue" if k.startswith("ours") else "tab:gray" for k in keys]
    a1.barh(list(ys), [s[k]["jobs_per_s"] for k in keys], color=colors)
    a1.set_yticks(list(ys))
    a1.set_yticklabels([_system_label(k).replace(", ", "\n", 1) for k in keys], fontsize=7)
    a1.axvline(4000, color="tab:red", ls="--", lw=1)
    a1.set_xlabel("processing jobs/s (median)")
    a1.set_title("processing")
    a2.barh([y - 0.2 for y in ys], [s[k]["enqueue_single_jobs_per_s"] for k in keys], 0.4, label="one at a time")
    a2.barh([y + 0.2 for y in ys], [s[k]["enqueue_batch_jobs_per_s"] for k in keys], 0.4, label="batch of 1,000")
    a2.set_yticks(list(ys))
    a2.set_yticklabels([])
    a2.set_xscale("log")
    a2.axvline(10000, color="tab:red", ls="--", lw=1)
    a2.set_xlabel("enqueue jobs/s (median, log scale)")
    a2.set_title("enqueue")
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_claim_cost(r: dict, path: Path) -> None:
    sizes = r["sizes"]
    labels = [n0(s["finished_rows"]) for s in sizes]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(sizes))
    ax.bar([x - 0.2 for x in xs], [s["claims_per_s"] for s in sizes], 0.4, label="claims/s (claim only, 1 conn)")
    ax.bar([x + 0.2 for x in xs], [s["worker_jobs_per_s"] for s in sizes], 0.4, label="worker jobs/s (4 threads)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels)
    ax.set_xlabel("finished rows in job_queue")
    ax.set_ylabel("per second (median)")
    top = max(max(s["claims_per_s"], s["worker_jobs_per_s"]) for s in sizes)
    ax.set_ylim(0, top * 1.3)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_title("Claim cost as finished rows pile up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_contention(r: dict, path: Path) -> None:
    vs = list(r["variants"])
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(vs))
    ax.bar([x - 0.2 for x in xs], [r["variants"][v]["no_holder_jobs_per_s"] for v in vs], 0.4, label="no holder")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["variants"][v]["holder_jobs_per_s"] for v in vs],
        0.4,
        label=f"{r['held']} oldest rows held FOR UPDATE",
    )
    ax.set_xticks(list(xs))
    ax.set_xticklabels(["jobqueue worker" if v == "ours" else v.replace("raw ", "raw loop\n") for v in vs], fontsize=8)
    ax.set_ylabel("jobs/s (median)")
    ax.legend(fontsize=8)
    ax.set_title("Contention: 4 workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_wake(r: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, key in (
        ("same process", "wake_in_process"),
        ("other process, doorbell", "wake_cross_process"),
        ("other process, polling", "wake_cross_process_polling"),
        ("other process, cap 0.5 s", "wake_cross_process_cap_0_5"),
    ):
        if key not in r:
            continue
        xs = sorted(r[key]["samples_ms"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label)
    ax.set_xscale("log")
    ax.axvline(50, color="tab:red", ls="--", lw=1)
    ax.set_xlabel("enqueue -> handler start, ms (log scale)")
    ax.set_ylabel("fraction of trials")
    ax.set_title("Wake-up latency (CDF)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_memory(r: dict, path: Path) -> None:
    t = [s[0] for s in r["samples"]]
    rss = [s[1] for s in r["samples"]]
    done = [s[2] for s in r["samples"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, rss, color="tab:blue", label="RSS")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("RSS, MiB", color="tab:blue")
    lo = min(rss) if rss else 0
    ax.set_ylim(0, max(rss) * 1.2 if rss else 1)
    ax2 = ax.twinx()
    ax2.plot(t, done, color="tab:gray", ls="--", label="jobs done")
    ax2.set_ylabel("jobs done", color="tab:gray")
    ax.set_title(f"jobqueue worker --concurrency 8, {r['jobs']:,} jobs (RSS min {lo:.0f} MiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
