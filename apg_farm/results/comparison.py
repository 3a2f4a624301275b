"""Comparing two results: two sweeps, a sweep and a baseline, or two baselines.

A "side" is a summary with the keys of an analysis (`sweep`, `outcomes`, `cells`, `models`,
`provenance`) plus `indispensable`, read from the store or from a baseline file. Differences are
B minus A, each with Newcombe's interval for independent samples: two sweeps are two separate
samples of the same models, so nothing pairs their trials. Each model's pooled difference also
has its task-clustered interval (`clustered`, results/clustered.py): the tasks are the clusters,
their difficulty shared by both sides. Each side also carries its **cost per
execution** (total cost ÷ priced executions), per model pooled over the tasks both sides ran and
both priced, for `--max-cost-increase`, and its second-chance figures (re-runs after the agent
started, the lower-bound pass rate; `second_chance`).

The rates compared are the **headlines** (headline.py: an attempt with a re-run the agent could
have bought counts as not passed), so a model that games its retries gains nothing here or in
`check`; each side also carries its rate over final outcomes, labelled `final_rate` ("with
re-runs"). A baseline promoted before the headline existed has only final outcomes: its rate is
that one, and `headline_unknown` names the side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from apg_farm.errors import NotFound
from apg_farm.results import exclusions, fixed_tasks
from apg_farm.results.analysis import analyse
from apg_farm.results.baseline import load_baseline
from apg_farm.results.clustered import as_dict as clustered_dict
from apg_farm.results.clustered import clustered_difference
from apg_farm.results.headline import headline_counts, headline_known
from apg_farm.results.report import find_sweep
from apg_farm.results.sealing import verify_seal
from apg_farm.results.stats import newcombe_unpaired, wilson
from apg_farm.results.verdict import compare_verdict
from apg_farm.store import Store

#: Provenance fingerprints whose change between the two sides is worth a warning.
WATCHED = ("grader_tree_sha256", "grader_class_sha256", "dataset_sha256")


@dataclass(frozen=True)
class Side:
    """One side of a comparison and what about its evidence does not verify."""

    label: str
    kind: Literal["sweep", "baseline"]
    summary: dict[str, Any]
    problems: tuple[str, ...] = ()


def load_side(ref: str, open_store: Callable[[], Store], *, k: int | None = None) -> Side:
    """A baseline file when `ref` is a file (or ends in .json), else a sweep id or name.

    A sealed sweep is verified against its manifest; a baseline against its content digest.
    """
    path = Path(ref)
    if path.is_file() or ref.endswith(".json"):
        if not path.is_file():
            raise NotFound(f"no baseline file {ref}")
        loaded = load_baseline(path)
        doc = dict(loaded.doc)
        doc.setdefault("indispensable", {})
        return Side(f"baseline {doc.get('name')} ({path})", "baseline", doc, loaded.problems)
    store = open_store()
    sweep = find_sweep(store, ref)
    summary = analyse(store, sweep, k=k)
    summary["indispensable"] = {}
    problems: tuple[str, ...] = ()
    if sweep.sealed_at is not None:
        checked = verify_seal(store, sweep)
        problems = tuple(f"sweep {sweep.name} seal: {line}" for line in checked.lines())
    return Side(f"sweep {sweep.name} (id {sweep.id})", "sweep", summary, problems)


def _rate(passed: int, n: int) -> dict[str, Any]:
    low, high = wilson(passed, n)
    return {
        "n": n,
        "passed": passed,
        "rate": passed / n if n else None,
        "ci_low": low if n else None,
        "ci_high": high if n else None,
    }


def _final(passed: int, n: int) -> dict[str, Any]:
    """The rate over final outcomes, re-runs counted as second chances: labelled, never gated."""
    return {"final_n": n, "final_passed": passed, "final_rate": passed / n if n else None}


def _side(cell: dict[str, Any]) -> dict[str, Any]:
    """One side of a (task, model): the headline with its interval, the final rate, counts."""
    return {
        **_rate(*headline_counts(cell)),
        **_final(cell["passed"], cell["n"]),
        "invalid": cell["invalid"],
        "error": cell["error"],
        **_cost([cell]),
        **_second_chance([cell]),
    }


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    diff = newcombe_unpaired(b["passed"], b["n"], a["passed"], a["n"])
    return {"diff": diff.estimate, "diff_low": diff.low, "diff_high": diff.high}


def _priced(cell: dict[str, Any]) -> bool:
    # A baseline promoted before costs were recorded has no cost keys: unknown, not zero.
    return cell.get("cost_usd") is not None and bool(cell.get("costed_executions"))


def _cost(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Total cost, priced executions and their ratio over cells (None when nothing was priced)."""
    priced = [c for c in cells if _priced(c)]
    total = sum(float(c["cost_usd"]) for c in priced)
    executions = sum(int(c["costed_executions"]) for c in priced)
    return {
        "cost_usd": total if priced else None,
        "costed_executions": executions,
        "cost_per_execution": total / executions if executions else None,
    }


def _second_chance(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Re-runs after the agent started and the lower-bound rate over cells (None: not recorded,
    as in a baseline promoted before they were kept)."""
    if not cells or any("lower_bound_n" not in c for c in cells):
        return {
            "rerun_attempts": None,
            "started_attempts": None,
            "lower_bound_rate": None,
            "lower_bound_ci_low": None,
            "lower_bound_ci_high": None,
        }
    n = sum(int(c["lower_bound_n"]) for c in cells)
    passed = sum(int(c["lower_bound_passed"]) for c in cells)
    low, high = wilson(passed, n)
    return {
        "rerun_attempts": sum(int(c["rerun_attempts"]) for c in cells),
        "started_attempts": sum(int(c["started_attempts"]) for c in cells),
        "lower_bound_rate": passed / n if n else None,
        "lower_bound_ci_low": low if n else None,
        "lower_bound_ci_high": high if n else None,
    }


def _exclusions(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any] | None:
    """Both sides' exclusion bound over the tasks both ran (an attempt counted or excluded after
    its agent started on each side), B − A on it, and the warning (exclusions.py)."""
    if any("exclusion_bound_n" not in cell for pair in pairs for cell in pair):
        return None  # a baseline promoted before #30: nothing is made up for it
    ran = [(a, b) for a, b in pairs if a["exclusion_bound_n"] and b["exclusion_bound_n"]]
    return exclusions.pair(
        exclusions.pooled(a for a, _ in ran),
        exclusions.pooled(b for _, b in ran),
        ("A", "B"),
        sign=1,
    )


def _headline_known(summary: dict[str, Any]) -> bool:
    return all(headline_known(cell) for cell in summary.get("cells", []))


def _fingerprints(summary: dict[str, Any], key: str) -> list[str]:
    return sorted(summary.get("provenance", {}).get("fingerprints", {}).get(key, {}))


def _why_left_out(cell: dict[str, Any]) -> str:
    """Why a (task, model) both sides ran is out of the model's figures."""
    sides = [name for name, side in (("A", cell["a"]), ("B", cell["b"])) if not side["n"]]
    return f"no counted attempt in {' and '.join(sides)}"


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per (task, model) and per model (over the tasks both sides ran), B against A."""
    cells_a = {(c["task"], c["model"]): c for c in a["cells"]}
    cells_b = {(c["task"], c["model"]): c for c in b["cells"]}
    cells = []
    for key in [k for k in cells_a if k in cells_b]:
        ra, rb = _side(cells_a[key]), _side(cells_b[key])
        cells.append({"task": key[0], "model": key[1], "a": ra, "b": rb, **_diff(ra, rb)})
    models = []
    for model in dict.fromkeys(c["model"] for c in cells):
        ran = [c for c in cells if c["model"] == model]
        # One task set for every figure of the pair (pooled, clustered, cost, the gates): the
        # tasks both sides have a counted attempt of. A task one side never counted would be in
        # the pooled rate and not in the clustered estimate, and they would disagree.
        mine = [c for c in ran if c["a"]["n"] and c["b"]["n"]]
        left_out = [{"task": c["task"], "why": _why_left_out(c)} for c in ran if c not in mine]
        pooled = {
            side: {
                **_rate(sum(c[side]["passed"] for c in mine), sum(c[side]["n"] for c in mine)),
                **_final(
                    sum(c[side]["final_passed"] for c in mine),
                    sum(c[side]["final_n"] for c in mine),
                ),
            }
            for side in ("a", "b")
        }
        # Cost only over the cells both sides priced: a cell priced on one side would compare
        # different task mixes.
        both = [(cells_a[(c["task"], model)], cells_b[(c["task"], model)]) for c in mine]
        shared = [pair for pair in both if _priced(pair[0]) and _priced(pair[1])]
        for index, side in enumerate(("a", "b")):
            known = any(_priced(pair[index]) for pair in both)
            pooled[side].update(_cost([pair[index] for pair in shared]), cost_known=known)
            pooled[side].update(_second_chance([pair[index] for pair in both]))
        models.append(
            {
                "model": model,
                "tasks": [c["task"] for c in mine],
                "left_out": left_out,
                "cost_tasks": [first["task"] for first, _ in shared],
                # Every excluded attempt after the start as a failure, and whether A and B
                # excluded alike.
                "exclusions": _exclusions(
                    [(cells_a[(c["task"], model)], cells_b[(c["task"], model)]) for c in ran]
                ),
                **pooled,
                **_diff(pooled["a"], pooled["b"]),
                # B - A with these tasks fixed ("this benchmark": fixed_tasks.py).
                "fixed_tasks": fixed_tasks.difference(
                    [(c["a"]["passed"], c["a"]["n"], c["b"]["passed"], c["b"]["n"]) for c in mine]
                ),
                # B - A with tasks as clusters: what `check` gates on by default.
                "clustered": clustered_dict(
                    clustered_difference(
                        [
                            (c["a"]["passed"], c["a"]["n"], c["b"]["passed"], c["b"]["n"])
                            for c in mine
                        ]
                    )
                ),
            }
        )
    changes = []
    for name in WATCHED:
        before, after = _fingerprints(a, name), _fingerprints(b, name)
        if before and after and before != after:
            changes.append(f"{name}: {', '.join(before)} -> {', '.join(after)}")
    found = {
        "models": models,
        "cells": cells,
        "only_in_a": [f"{t} {m}" for (t, m) in cells_a if (t, m) not in cells_b],
        "only_in_b": [f"{t} {m}" for (t, m) in cells_b if (t, m) not in cells_a],
        "outcomes": {"a": a.get("outcomes", {}), "b": b.get("outcomes", {})},
        "provenance_changes": changes,
        "exclusion_warnings": [
            f"{row['model']}: {row['exclusions']['warning']}"
            for row in models
            if row["exclusions"] and row["exclusions"]["warning"]
        ],
        # Sides whose cells lack the headline counts (a baseline promoted before them): their
        # rate is the one over final outcomes.
        "headline_unknown": [
            side for side, summary in (("a", a), ("b", b)) if not _headline_known(summary)
        ],
        # Each side's stopping rule (`stop:`) and decision, None without one: a side that
        # stopped early has fixed-n figures not valid under optional stopping.
        "stop": {"a": a.get("stop"), "b": b.get("stop")},
        # Each side's sweep-wide re-runs after the agent started (None: not recorded).
        "second_chance": {
            "a": {"rerun_share": (a.get("second_chance") or {}).get("rerun_share")},
            "b": {"rerun_share": (b.get("second_chance") or {}).get("rerun_share")},
        },
    }
    # B − A per model, one line each: what a person reads first.
    found["verdict"] = compare_verdict(found)
    return found
