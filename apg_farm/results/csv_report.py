"""The CSV report: one row per (task, model) of a sweep's analysis, for spreadsheets and pandas."""

from __future__ import annotations

import csv
import io
from typing import Any

from apg_farm.contract import KINDS
from apg_farm.results.costs import TOKENS
from apg_farm.results.report import CELL_COUNTS
from apg_farm.results.second_chance import CELL_KEYS

#: CSV columns, one row per (task, model).
CSV_COLUMNS = (
    "task",
    "model",
    "n",
    *CELL_COUNTS.values(),
    "pending",
    "cancelled",
    # The headline (docs/analysis.md, "Second-chance bias"), then the rate with re-runs.
    "pass_rate",
    "ci_low",
    "ci_high",
    "final_rate",
    "final_ci_low",
    "final_ci_high",
    "k",
    "pass_at_k",
    "pass_hat_k",
    # What the cell cost (docs/analysis.md, "Cost"); empty where no adapter record was read.
    "cost_usd",
    "median_cost_usd",
    "cost_per_pass",
    "cost_per_pass_low",
    "cost_per_pass_high",
    *TOKENS,
    # The second-chance bias (docs/analysis.md, "Second-chance bias").
    # Its one dict (reruns_by_kind) spread into a column per kind.
    *(
        column
        for key in CELL_KEYS
        for column in ([f"reruns_{kind}" for kind in KINDS] if key == "reruns_by_kind" else [key])
    ),
)


def report_csv(report: dict[str, Any]) -> str:
    """One row per (task, model), with the rates, intervals, pass@k and every outcome count."""
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for cell in report["cells"]:
        kinds = cell.get("reruns_by_kind") or {}
        writer.writerow(
            {
                **cell,
                **(cell.get("tokens") or {}),
                **{f"reruns_{kind}": kinds.get(kind, 0) for kind in KINDS},
                "k": report["k"],
            }
        )
    return buffer.getvalue()
