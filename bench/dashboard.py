"""6. Dashboard (issue item 6) -- TODO: not implemented yet.

This is the hook for it: `python -m bench.run --only dashboard` runs `run(ctx)`, and the report
has a section for whatever it returns (bench/report.py, `_dashboard`). When the dashboard's
measurements are written, replace the body of `run` with them and return a dict like the other
scenarios (see bench/throughput.py); keep `TODO = False` then so the report renders the results.
"""

from __future__ import annotations

from typing import Any

TODO = True


def run(ctx) -> dict[str, Any]:
    # TODO(issue item 6): measure the dashboard (page render times under load, etc.).
    return {"todo": True, "note": "issue item 6 (dashboard) is not measured yet; bench/dashboard.py is the hook"}
