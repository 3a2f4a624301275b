"""The HTML report: one self-contained file (inline CSS and SVG, nothing fetched from a network).

It draws each (task, model) pass rate with its Wilson interval as a forest plot, then the tables:
outcomes, results per cell and per model, cost per model and per cell with the cost-effectiveness
plot (`cost_plot`), pairwise comparisons, phase durations, bed health and provenance. Input is
`apg_farm.results.analysis.analyse` output; every string is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from apg_farm.results.clustered import MIN_TASKS
from apg_farm.results.cost_plot import cost_per_execution, cost_plot_svg, cost_points, usd
from apg_farm.results.dataset_hashes import dataset_hash_lines
from apg_farm.results.exclusions import warnings as exclusion_warnings
from apg_farm.results.stop_report import stop_section
from apg_farm.results.timeline_plot import timeline_svg

#: One colour per model, in the sweep's model order (colour-blind-safe Okabe-Ito palette).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

# Figures stay on one line; text cells (td.l: names, reasons, hashes) wrap, so a long
# quarantine reason stays in view instead of widening its table past the page.
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1240px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums;font-size:13px}
th,td{padding:3px 6px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f5f5f5;font-weight:600;white-space:normal;vertical-align:bottom;font-size:.86em;min-width:3em}
td.l,th.l{text-align:left}td.l,td.ci{white-space:normal}.nw{white-space:nowrap}
.figure svg{max-width:100%;height:auto}
.wrap{overflow-x:auto}td.warn{color:#a15c00;font-weight:600}.muted{color:#777}.bad{color:#b00020;font-weight:600}
.caption{color:#555;font-size:.92em;max-width:900px}code{font-size:.9em}
svg text{font:12px system-ui,sans-serif}.swatch{display:inline-block;width:.9em;height:.9em;
margin:0 .3em 0 1em;vertical-align:-.1em;border-radius:2px}
"""


def _pct(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _cell(value: Any, *, left: bool = False, warn: bool = False, ci: bool = False) -> str:
    """One cell; `ci`: "rate [low–high]", which may wrap before its interval (never inside a
    number)."""
    classes = " ".join(c for c, on in (("l", left), ("warn", warn), ("ci", ci)) if on)
    attr = f' class="{classes}"' if classes else ""
    rate, bracket, interval = str(value).partition(" [")
    if ci and bracket:
        return f'<td{attr}>{escape(rate)} <span class="nw">[{escape(interval)}</span></td>'
    return f"<td{attr}>{escape(str(value))}</td>"


def _table(
    table_id: str, headers: list[str], rows: list[str], *, left: int = 1, caption: str = ""
) -> str:
    head = "".join(
        f'<th class="l">{escape(h)}</th>' if i < left else f"<th>{escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(f"<tr>{row}</tr>" for row in rows) or (
        f'<tr><td class="l muted" colspan="{len(headers)}">none</td></tr>'
    )
    note = f'<p class="caption">{caption}</p>' if caption else ""
    return (
        f'<div class="wrap"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>{note}"
    )


def forest_plot(report: dict[str, Any]) -> str:
    """SVG: one row per (task, model) and per model pooled, a dot at the rate, a bar for its CI."""
    models = [m["model"] for m in report.get("models", [])]
    colour = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(models)}
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for cell in report["cells"]:
        if not groups or groups[-1][0] != cell["task"]:
            groups.append((cell["task"], []))
        groups[-1][1].append(cell)
    groups.append(("all tasks (pooled)", report.get("models", [])))

    plot_x, plot_w, text_x = 345, 470, 830
    row_h, top = 20, 34
    lines: list[str] = []
    y = top
    for title, rows in groups:
        y += 6
        lines.append(f'<text x="8" y="{y + 10}" font-weight="600">{escape(title)}</text>')
        y += row_h
        for row in rows:
            model = row["model"]
            cy = y + row_h / 2
            lines.append(
                f'<text x="24" y="{cy + 4}" fill="{colour.get(model, "#333")}">'
                f"{escape(model)}</text>"
            )
            if row.get("pass_rate") is None:
                lines.append(
                    f'<text x="{plot_x}" y="{cy + 4}" class="muted" fill="#777">'
                    "no counted attempt</text>"
                )
            else:
                x0 = plot_x + plot_w * row["ci_low"]
                x1 = plot_x + plot_w * row["ci_high"]
                xp = plot_x + plot_w * row["pass_rate"]
                c = colour.get(model, "#333")
                pooled = "tasks" in row
                lines.append(
                    f'<line class="ci" x1="{x0:.1f}" y1="{cy}" x2="{x1:.1f}" y2="{cy}" '
                    f'stroke="{c}" stroke-width="2"/>'
                )
                if pooled:
                    lines.append(
                        f'<path class="point pooled" d="M{xp:.1f} {cy - 6}l6 6l-6 6l-6 -6z" fill="{c}"/>'
                    )
                else:
                    lines.append(
                        f'<circle class="point" cx="{xp:.1f}" cy="{cy}" r="4.5" fill="{c}"/>'
                    )
            rate = row.get("pass_rate")
            summary = (
                f"{_pct(rate)} [{_pct(row['ci_low'])}–{_pct(row['ci_high'])}] n={row['n']}"
                if rate is not None
                else f"n={row['n']}"
            )
            lines.append(f'<text x="{text_x}" y="{cy + 4}">{escape(summary)}</text>')
            y += row_h
    height = y + 12
    axis = []
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = plot_x + plot_w * tick
        axis.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 8}" stroke="#e3e3e3"/>'
            f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle" fill="#555">{tick:.0%}</text>'
        )
    width = text_x + 200
    return (
        f'<svg id="forest-plot" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="pass rate with 95% Wilson interval per task '
        f'and model">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>'
        f'<text x="8" y="{top - 10}" fill="#555">pass rate, 95% Wilson interval</text>'
        f"{''.join(axis)}{''.join(lines)}"
        "</svg>"
    )


_COST_HEADERS = [
    "n",
    "pass rate",
    "total",
    "priced execs",
    "mean/exec",
    "median/exec",
    "per pass",
    "95% CI",
    "tokens in / out",
    "cache read / write",
]


def _tokens(tokens: dict[str, int], first: str, second: str) -> str:
    return f"{tokens[first]:,} / {tokens[second]:,}" if tokens else "—"


def _cost_cells(row: dict[str, Any]) -> str:
    """The cost columns of one cell or model row (— where nothing was priced)."""
    low, high = row.get("cost_per_pass_low"), row.get("cost_per_pass_high")
    interval = "—" if low is None else f"{usd(low)} – {usd(high) if high is not None else '∞'}"
    tokens = row.get("tokens") or {}
    return (
        _cell(row["n"])
        + _cell(_pct(row.get("pass_rate"), 1))
        + _cell(usd(row.get("cost_usd")))
        + _cell(row.get("costed_executions") or 0)
        + _cell(usd(cost_per_execution(row)))
        + _cell(usd(row.get("median_cost_usd")))
        + _cell(usd(row.get("cost_per_pass")))
        + _cell(interval)
        + _cell(_tokens(tokens, "input_tokens", "output_tokens"))
        + _cell(_tokens(tokens, "cache_read_tokens", "cache_write_tokens"))
    )


#: What the pass rate every table leads with is, said where it is shown.
HEADLINE_NOTE = (
    "Pass rate: the headline, an attempt re-run after its agent started for a reason the agent "
    "could have written counted as not passed (ERROR and INVALID ones added to n); with re-runs: "
    "over final outcomes, re-runs counted as second chances; lower bound: every re-run after the "
    "agent started counted as a failure."
)

_BESIDE_HEADERS = ["with re-runs", "lower bound"]


def _beside(row: dict[str, Any]) -> str:
    """The labelled figures beside the headline: the rate with re-runs, and the lower bound."""
    low = row.get("lower_bound_rate")
    return _cell(_pct(row.get("final_rate"), 1)) + _cell(
        _pct(low, 1), warn=low is not None and low != row.get("pass_rate")
    )


def _kinds(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in (row.get("reruns_by_kind") or {}).items()) or "—"


def _rerun_cells(row: dict[str, Any]) -> str:
    """Second-chance columns of one cell or model row: re-runs, then the rates side by side."""
    headline = (
        f"{_pct(row.get('pass_rate'))} [{_pct(row.get('ci_low'))}–{_pct(row.get('ci_high'))}]"
        if row.get("pass_rate") is not None
        else "—"
    )
    final = (
        f"{_pct(row.get('final_rate'))} [{_pct(row.get('final_ci_low'))}–"
        f"{_pct(row.get('final_ci_high'))}]"
        if row.get("final_rate") is not None
        else "—"
    )
    low = row.get("lower_bound_rate")
    bound = (
        f"{_pct(low)} [{_pct(row.get('lower_bound_ci_low'))}–"
        f"{_pct(row.get('lower_bound_ci_high'))}]"
        if low is not None
        else "—"
    )
    excluded = row.get("exclusion_bound_rate")
    exclusion = (
        f"{_pct(excluded)} [{_pct(row.get('exclusion_bound_ci_low'))}–"
        f"{_pct(row.get('exclusion_bound_ci_high'))}]"
        if excluded is not None
        else "—"
    )
    return (
        _cell(row.get("started_attempts", 0))
        + _cell(row.get("rerun_attempts", 0), warn=bool(row.get("rerun_attempts")))
        + _cell(row.get("second_chance_attempts", 0), warn=bool(row.get("second_chance_attempts")))
        + _cell(row.get("reruns", 0))
        + _cell(_kinds(row), left=True)
        + _cell(_pct(row.get("rerun_share")))
        + _cell(f"{row.get('headline_passed', 0)}/{row.get('headline_n', 0)}")
        + _cell(headline, ci=True)
        + _cell(f"{row.get('passed', 0)}/{row.get('n', 0)}")
        + _cell(final, ci=True)
        + _cell(f"{row.get('lower_bound_passed', 0)}/{row.get('lower_bound_n', 0)}")
        + _cell(bound, warn=low is not None and low != row.get("pass_rate"), ci=True)
        + _cell(row.get("excluded_after_start", 0), warn=bool(row.get("excluded_after_start")))
        + _cell(exclusion, warn=bool(row.get("excluded_after_start")), ci=True)
    )


_RERUN_HEADERS = [
    "attempts started",
    "with a re-run",
    "with a re-run the agent could have bought",
    "re-runs",
    "kinds",
    "re-run share",
    "headline passed / n",
    "headline [95% CI]",
    "with re-runs passed / n",
    "with re-runs [95% CI]",
    "lower bound passed / n",
    "lower bound [95% CI]",
    "excluded after the start",
    "exclusion bound [95% CI]",
]


def second_chance_section(report: dict[str, Any]) -> str:
    """The second-chance bias: re-runs after the agent started, and the lower-bound pass rate."""
    totals = report.get("second_chance") or {}
    share = totals.get("rerun_share")
    summary = (
        f'<p id="rerun-share">Sweep: {totals.get("rerun_attempts", 0)} of '
        f"{totals.get('started_attempts', 0)} attempts that reached the run phase were run again "
        f"after their agent started (re-run share {_pct(share, 1)}); "
        f"{totals.get('reruns', 0)} such re-runs ({escape(_kinds(totals))}). Pass rate "
        f"{_pct(totals.get('pass_rate'), 1)} (headline), with re-runs "
        f"{_pct(totals.get('final_rate'), 1)}, lower bound {_pct(totals.get('lower_bound_rate'), 1)}"
        f" [{_pct(totals.get('lower_bound_ci_low'), 1)}–"
        f"{_pct(totals.get('lower_bound_ci_high'), 1)}].</p>"
    )
    model_rows = [_cell(m["model"], left=True) + _rerun_cells(m) for m in report.get("models", [])]
    cell_rows = [
        _cell(c["task"], left=True) + _cell(c["model"], left=True) + _rerun_cells(c)
        for c in report["cells"]
    ]
    caption = (
        "A re-run after the agent started is an execution whose run phase began and whose result "
        "is RETRY or LOST. When its reason rests on what the agent could write (a start claim, "
        "provider trouble, a timeout, a grade that could not run, other) the agent may have "
        "bought it: the headline counts its attempt as not passed. A lost lease, a farm error, a "
        "failed link after the run or a claim the farm reproduced cost the model nothing. The "
        "lower bound counts every attempt with a re-run as a failure; both add ERROR and "
        "INVALID ones to n. The exclusion bound counts every attempt that ended INVALID, ERROR "
        "or SKIPPED after its agent started as a failure of the headline."
    )
    return f"""{summary}
{_table("second-chance-models-table", ["model", *_RERUN_HEADERS], model_rows, caption=caption)}
{_table("second-chance-cells-table", ["task", "model", *_RERUN_HEADERS], cell_rows, left=2)}"""


def cost_section(report: dict[str, Any]) -> str:
    """Cost tables and the cost-effectiveness plot, or one line saying cost is unknown."""
    models = report.get("models", [])
    if not any(row.get("cost_usd") is not None for row in models):
        return (
            '<p class="muted" id="cost-unknown">Cost unknown: no execution of this sweep has a '
            "cost record from its adapter (claude.json), so there is no cost table or "
            "cost-effectiveness plot.</p>"
        )
    points = cost_points(models, PALETTE)
    plotted = {p.label for p in points}
    left_out = [m["model"] for m in models if m["model"] not in plotted]
    missing = (
        f'<p class="caption" id="cost-not-plotted">Not plotted (no priced execution or no counted '
        f"attempt): {escape(', '.join(left_out))}.</p>"
        if left_out
        else ""
    )
    model_rows = [_cell(m["model"], left=True) + _cost_cells(m) for m in models]
    cell_rows = [
        _cell(c["task"], left=True) + _cell(c["model"], left=True) + _cost_cells(c)
        for c in report["cells"]
    ]
    return f"""{cost_plot_svg(points) if points else ""}
<p class="caption">Each model's pooled pass rate (bar: 95% Wilson interval) against its <b>mean cost
per execution</b> (total cost ÷ priced executions, retries and errors included). Ringed models, joined
by the dashed line, are the Pareto front: no other model costs at most as much and passes at least
as often while being better at one of the two. Overlapping bars mean the order is not decisive.</p>
{missing}
{_table("cost-models-table", ["model", *_COST_HEADERS], model_rows)}
{_table("cost-cells-table", ["task", "model", *_COST_HEADERS], cell_rows, left=2, caption="From the adapter's records (claude.json), read after each run. total: every execution, retries and errors included; priced execs: executions with a cost record; mean/exec = total ÷ priced execs (the plot's x); per pass: total ÷ passes, its interval the total over n × the pass rate's Wilson bounds (∞ while the lower bound is 0).")}"""


def _counts(row: dict[str, Any]) -> str:
    return "".join(_cell(row[k]) for k in ("passed", "failed", "no_attempt", "tampered")) + "".join(
        _cell(row[k], warn=bool(row[k])) for k in ("skipped", "invalid", "error", "pending")
    )


_COUNT_HEADERS = [
    "pass",
    "fail",
    "no-attempt",
    "tampered",
    "skipped",
    "INVALID",
    "ERROR",
    "pending",
]


def _clustered(row: dict[str, Any]) -> str:
    """A row's task-clustered 95 % interval cell, or why there is none."""
    clustered = row.get("clustered") or {}
    if "high" in clustered:
        return _cell(f"{_pct(clustered['low'], 1)} – {_pct(clustered['high'], 1)}")
    if "unavailable" in clustered:
        return _cell(f"— ({clustered['tasks']} tasks)")
    return _cell("—")


def dataset_hash_section(report: dict[str, Any]) -> str:
    """Each task graded against more than one dataset or task hash: the hashes and the attempts
    behind each (results/dataset_hashes.py), so a person knows which to look at."""
    found = report.get("dataset_hashes") or {}
    if not found.get("tasks"):
        return ""
    rows = []
    for entry in found["tasks"]:
        for item in entry["hashes"]:
            attempts = ", ".join(
                f"{a['attempt']} ({a['model']} trial {a['trial']} try {a['try']}, {a['bed']}: "
                f"{a['result']})"
                for a in item["attempts"]
            )
            more = item["executions"] - len(item["attempts"])
            if more > 0:
                attempts += f" (+{more} more)"
            rows.append(
                _cell(entry["task"], left=True)
                + _cell(entry["field"], left=True)
                + f'<td class="l"><code>{escape(item["sha256"])}</code></td>'
                + _cell(str(item["executions"]))
                + f'<td class="l">{escape(attempts)}</td>'
            )
    lines = "".join(f'<p class="bad">{escape(line)}</p>' for line in dataset_hash_lines(report))
    table = _table(
        "dataset-hashes-table", ["task", "field", "sha256", "grades", "attempts"], rows, left=2
    )
    return f'<div id="dataset-hashes">{lines}{table}</div>'


def _over_time(timeline: dict[str, Any] | None) -> str:
    if timeline is None:
        return ""
    return (
        f'<h2>Over time</h2><div class="figure">{timeline_svg(timeline)}</div>'
        '<p class="caption">Attempts finished per hour, the queue, the beds that ran the sweep by '
        "state, and each model's pass rate over its finished attempts (final outcomes: the "
        "<i>with re-runs</i> column as it grew), at the end of each of "
        f"{timeline['bins']} equal bins.</p>"
    )


def render_html(report: dict[str, Any], timeline: dict[str, Any] | None = None) -> str:
    """The whole report as one HTML document; with the sweep's `timeline` (timeline.py), its
    figure over time below the forest plot."""
    sweep, prov, k = report["sweep"], report.get("provenance", {}), report.get("k", 1)
    models = [m["model"] for m in report.get("models", [])]
    legend = "".join(
        f'<span class="swatch" style="background:{PALETTE[i % len(PALETTE)]}"></span>{escape(m)}'
        for i, m in enumerate(models)
    )
    outcomes = report.get("outcomes", {})
    prominent = {"INVALID", "ERROR", "SKIPPED"}
    outcome_rows = [
        _cell(name, left=True) + _cell(count, warn=name in prominent and bool(count))
        for name, count in outcomes.items()
    ]
    cell_rows = [
        _cell(c["task"], left=True)
        + _cell(c["model"], left=True)
        + _cell(c["n"])
        + _cell(_pct(c["pass_rate"], 1))
        + _cell(f"{_pct(c['ci_low'], 1)} – {_pct(c['ci_high'], 1)}" if c["n"] else "—")
        + _beside(c)
        + _cell(_pct(c.get("pass_at_k"), 1))
        + _cell(_pct(c.get("pass_hat_k"), 1))
        + _counts(c)
        for c in report["cells"]
    ]
    model_rows = [
        _cell(m["model"], left=True)
        + _cell(m["tasks"])
        + _cell(m["n"])
        + _cell(_pct(m["pass_rate"], 1))
        + _cell(f"{_pct(m['ci_low'], 1)} – {_pct(m['ci_high'], 1)}" if m["n"] else "—")
        + _clustered(m)
        + _beside(m)
        + _cell(_pct(m.get("pass_at_k"), 1))
        + _cell(_pct(m.get("pass_hat_k"), 1))
        + _counts(m)
        for m in report.get("models", [])
    ]
    comparisons = report.get("comparisons", [])
    comparison_rows = [
        _cell(r["model_a"], left=True)
        + _cell(r["model_b"], left=True)
        + _cell(r["pairs"])
        + _cell(f"{r['both']} / {r['a_only']} / {r['b_only']} / {r['neither']}")
        + _cell(_pct(r["rate_a"], 1))
        + _cell(_pct(r["rate_b"], 1))
        + _cell(_pct(r["diff"], 1))
        + _cell(f"{_pct(r['diff_low'], 1)} – {_pct(r['diff_high'], 1)}")
        + _clustered(r)
        + _cell(_p(r["p_value"]) + ("" if r.get("fixed_n_valid", True) else " †"))
        + _cell(_p(r["p_holm"]))
        for r in comparisons
    ]
    phase_rows = [
        _cell(name, left=True)
        + _cell(d["count"])
        + _cell(_num(d["median"]))
        + _cell(_num(d["p95"]))
        + _cell(_num(d["max"]))
        for name, d in report.get("phases", {}).items()
    ]
    bed_rows = [
        _cell(b["bed"], left=True)
        + _cell(b["state"], left=True, warn=b["state"] != "active")
        + _cell(b["executions"])
        + _cell(", ".join(f"{k} {v}" for k, v in b["results"].items()), left=True)
        + _cell(b["retries"], warn=bool(b["retries"]))
        + _cell(b["lost"], warn=bool(b["lost"]))
        + _cell(_pct(b["infra_failure_rate"]))
        + _cell(b["quarantined_during_sweep"], warn=bool(b["quarantined_during_sweep"]))
        + _cell(_num(b["median_bed_seconds"]))
        + _cell(", ".join(h[:16] for h in b["grader_tree_sha256"]) or "—", left=True)
        + _cell(b["reason"] or "", left=True)
        for b in report.get("beds", [])
    ]
    prov_rows = [
        _cell(key, left=True) + f'<td class="l"><code>{escape(str(value))}</code></td>'
        for key, value in (
            ("apg-farm version", prov.get("farm_version")),
            ("sweep spec sha256", prov.get("spec_sha256")),
            ("dataset", prov.get("dataset")),
            ("agent", prov.get("agent")),
            ("created", prov.get("created_at")),
            ("sealed", prov.get("sealed_at") or "not sealed"),
            ("seal manifest sha256", prov.get("seal_sha256") or "—"),
            ("graded envelopes", prov.get("envelopes")),
            (
                "graded with",
                ", ".join(f"{k} ({v})" for k, v in prov.get("eval_libraries", {}).items()) or "—",
            ),
        )
    ]
    for key, values in prov.get("fingerprints", {}).items():
        text = ", ".join(f"{v} ({n})" for v, n in values.items())
        prov_rows.append(_cell(key, left=True) + f'<td class="l"><code>{escape(text)}</code></td>')
    for task, values in prov.get("task_sha256", {}).items():
        text = ", ".join(f"{v} ({n})" for v, n in values.items())
        prov_rows.append(
            _cell(f"task_sha256 {task}", left=True)
            + f'<td class="l"><code>{escape(text)}</code></td>'
        )
    estimand = f'<p id="estimand">{escape(report.get("estimand") or "")}</p>' + (
        f'<p id="few-tasks" class="bad">{escape(report["few_tasks"])}</p>'
        if report.get("few_tasks")
        else ""
    )
    warnings = "".join(
        f'<p class="bad">{escape(w)}</p>'
        for w in (*prov.get("warnings", []), *exclusion_warnings(comparisons))
    )
    untrusted = ", ".join(report.get("untrusted_verifier", []))
    untrusted_note = (
        f'<p class="bad" id="untrusted-verifier">Untrusted verifier: attempts on {escape(untrusted)} '
        "were verified by the agent-writable <code>ddev ai-eval-verify</code> (beds enrolled "
        "with --untrusted-verifier), not by an escrowed verifier.</p>"
        if untrusted
        else ""
    )
    excluded = sum(outcomes.get(o, 0) for o in ("INVALID", "ERROR", "SKIPPED"))
    title = f"apg-farm report: {sweep['name']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="muted">sweep id {sweep["id"]}, state {escape(str(sweep["state"]))}, {sweep["attempts"]} attempts,
{len(report["cells"])} (task, model) cells. Rates count PASSED, FAILED, NO_ATTEMPT and TAMPERED;
{excluded} INVALID, ERROR or SKIPPED attempts are outside every rate and shown beside it.</p>
{untrusted_note}

<h2>Pass rates</h2>
<p>{legend}</p>
{forest_plot(report)}
<p class="caption">Dots are headline pass rates, bars their 95% Wilson intervals; diamonds pool each model over
its tasks. Overlapping bars mean the ranking is not decisive evidence; the pairwise table below tests it.</p>
{_over_time(timeline)}

<h2>Outcomes</h2>
{_table("outcomes-table", ["outcome", "attempts"], outcome_rows)}

<h2>Results per task and model</h2>
{_table("cells-table", ["task", "model", "n", "pass rate", "95% CI", *_BESIDE_HEADERS, f"pass@{k}", f"pass^{k}", *_COUNT_HEADERS], cell_rows, left=2, caption=f"{HEADLINE_NOTE} pass@{k}: chance that at least one of {k} trials passes; pass^{k}: chance that all {k} pass (unbiased estimators over the trials; — when fewer than {k} were counted).")}

<h2>Per model</h2>
{_table("models-table", ["model", "tasks", "n", "pass rate", "95% CI (naive)", "95% CI (task-clustered)", *_BESIDE_HEADERS, f"pass@{k}", f"pass^{k}", *_COUNT_HEADERS], model_rows, caption=f"{HEADLINE_NOTE} Pooled over tasks; pass@{k} and pass^{k} are means over tasks. The naive interval (Wilson) takes every attempt as independent; the task-clustered one (CR3, tasks as clusters, t on Bell–McCaffrey df) allows for tasks that differ in difficulty, and is given from {MIN_TASKS} tasks on: read it.")}
{estimand}

<h2>Second-chance bias</h2>
{second_chance_section(report)}

<h2>Cost</h2>
{cost_section(report)}

<h2>Pairwise comparison</h2>
{_table("comparisons-table", ["model A", "model B", "pairs", "both / A only / B only / neither", "A", "B", "A − B", "95% CI", "95% CI (task-clustered)", "p (McNemar exact)", "p (Holm)"], comparison_rows, left=2, caption=f"Paired over the (task, trial) cells both models have an outcome the headline counts for, as the headline counts them (a pass after a re-run the agent could have bought is a failure). The first interval is Newcombe's for paired proportions, every pair independent; the task-clustered one takes the tasks as clusters; p is the exact McNemar (sign) test on the discordant pairs, Holm-adjusted over {len(comparisons)} comparisons. An interval that crosses 0 does not decide which model is better.")}
{stop_section(report)}

<h2>Phase durations (seconds)</h2>
{_table("phases-table", ["phase", "count", "median", "p95", "max"], phase_rows)}

<h2>Beds</h2>
{_table("beds-table", ["bed", "state", "executions", "results", "retries", "lost", "infra failures", "quarantined", "median bed s", "grader_tree_sha256", "reason"], bed_rows, left=2)}

<h2>Provenance</h2>
{warnings}
{dataset_hash_section(report)}
{_table("provenance-table", ["item", "value"], prov_rows, left=2)}
</body></html>
"""
