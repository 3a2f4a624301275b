"""How many trials a sweep needs to tell its models apart, and what they cost (#21, part 2).

`sweep submit FILE --dry-run --detect D` plans, for every pair of the sweep's models, the trials
per (task, model) at which the farm's paired, task-clustered comparison (`results/clustered.py`)
detects a pooled difference D with the asked power (`results/power.py` has the statistics), and
prices the worst pair's trials with the dry run's own estimate (`estimate.py`).

The figures come from the store, every sweep's counted attempts of the sweep's tasks and models:
- each (task, model)'s pass rate, with at least MIN_ATTEMPTS counted attempts, else ASSUMED_RATE
  (0.5: the largest variance, so the plan errs long);
- the models' correlation on the same cell, within tasks, over the (sweep, task, trial) cells both
  ran, with at least MIN_PAIRED such cells, else ASSUMED_CORRELATION (0: errs long, since the
  shared site and prompt make it positive);
- the spread across tasks of the true difference (tau), from at least MIN_TASKS tasks with rates
  for both models, else ASSUMED_TASK_SD.
`--correlation` and `--task-sd` override the last two. Every figure says where it came from.

Several pairs are each planned at alpha / pairs (Bonferroni): the reports adjust with Holm, whose
first step is that and whose power is never lower, so each pair keeps at least the planned power.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, and_, case, func, select
from sqlalchemy.orm import Session, aliased

from apg_farm.contract import COUNTED, Outcome
from apg_farm.errors import BadInput
from apg_farm.results import (
    MIN_TASKS,
    Paired,
    Rate,
    between_task_variance,
    cell_variance,
    paired_power,
    tasks_needed,
    trials_needed,
    within_task_correlation,
)
from apg_farm.scheduler.estimate import SweepEstimate, Total, _as_dict, _duration, _usd
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Store

DEFAULT_POWER = 0.8
DEFAULT_ALPHA = 0.05
#: Below this many counted attempts a (task, model)'s rate is assumed.
MIN_ATTEMPTS = 3
#: Below this many paired cells the correlation is assumed.
MIN_PAIRED = 20
ASSUMED_RATE = 0.5
ASSUMED_CORRELATION = 0.0
#: The SD across tasks of one model's lead over another: agent benchmarks' tasks differ a lot.
ASSUMED_TASK_SD = 0.10


@dataclass(frozen=True)
class Figure:
    """One input of the plan and where it came from: history, assumed, or a flag."""

    value: float
    source: str
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {"value": round(self.value, 6), "source": self.source, "note": self.note}


@dataclass(frozen=True)
class PairPlan:
    """The plan for comparing models `a` and `b`."""

    a: str
    b: str
    correlation: Figure
    task_sd: Figure
    #: Mean over the sweep's tasks of one cell's Var(a - b).
    within: float
    #: Fewest trials per (task, model) with the asked power; None: not at any count.
    trials_needed: int | None
    #: Power at the sweep's own trials, and with unlimited trials (the task-spread floor).
    power_at_trials: float
    max_power: float
    #: Fewest tasks with the asked power at the sweep's trials, and at unlimited trials.
    tasks_at_trials: int | None
    tasks_unlimited: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "models": [self.a, self.b],
            "trials_needed": self.trials_needed,
            "reachable": self.trials_needed is not None,
            "achieved_power": round(self.power_at_trials, 4),
            "max_power": round(self.max_power, 4),
            "tasks_needed_at_trials": self.tasks_at_trials,
            "tasks_needed_unlimited_trials": self.tasks_unlimited,
            "cell_variance": round(self.within, 6),
            "correlation": self.correlation.as_dict(),
            "task_sd": self.task_sd.as_dict(),
        }


@dataclass(frozen=True)
class PowerPlan:
    """The trials a sweep needs for its comparisons, the inputs used, and their price."""

    detect: float
    power: float
    alpha: float
    tasks: int
    trials: int
    models: tuple[str, ...]
    #: (task, model) -> counted attempts and passes; absent: under MIN_ATTEMPTS, rate assumed.
    rates: dict[tuple[str, str], Rate]
    pairs: tuple[PairPlan, ...]
    estimate: SweepEstimate
    #: The dry run's estimate at the worst pair's trials; None when no count reaches the power.
    at_needed: SweepEstimate | None

    @property
    def alpha_per_pair(self) -> float:
        return self.alpha / max(1, len(self.pairs))

    @property
    def worst(self) -> PairPlan | None:
        """The pair needing the most trials (an unreachable one first)."""
        if not self.pairs:
            return None
        return max(
            self.pairs, key=lambda p: math.inf if p.trials_needed is None else p.trials_needed
        )

    @property
    def trials_needed(self) -> int | None:
        worst = self.worst
        return None if worst is None else worst.trials_needed

    def rate_rows(self) -> list[dict[str, Any]]:
        rows = []
        for task in self.estimate_tasks():
            for model in self.models:
                found = self.rates.get((task, model))
                rows.append(
                    {
                        "task": task,
                        "model": model,
                        "rate": round(found.rate, 6) if found else ASSUMED_RATE,
                        "attempts": found.attempts if found else 0,
                        "passes": found.passes if found else 0,
                        "source": "history" if found else "assumed",
                    }
                )
        return rows

    def estimate_tasks(self) -> list[str]:
        return list(dict.fromkeys(p.task for p in self.estimate.pairs))

    def as_dict(self) -> dict[str, Any]:
        worst = self.worst
        at = self.at_needed
        return {
            "detect": self.detect,
            "power": self.power,
            "alpha": self.alpha,
            "alpha_per_pair": round(self.alpha_per_pair, 6),
            "adjustment": "bonferroni" if len(self.pairs) > 1 else "none",
            "analysis": "paired difference a - b over (task, trial) cells, task-clustered CR3 "
            "standard error, two-sided t test on tasks - 1 df; power from the noncentral t",
            "tasks": self.tasks,
            "trials": self.trials,
            "trials_per_cell_needed": self.trials_needed,
            "reachable": worst is not None and worst.trials_needed is not None,
            "worst_pair": [worst.a, worst.b] if worst else None,
            "achieved_power": round(worst.power_at_trials, 4) if worst else None,
            "note": self.note(),
            "pairs": [p.as_dict() for p in self.pairs],
            "assumptions": {
                "rate_without_history": ASSUMED_RATE,
                "min_attempts_for_a_rate": MIN_ATTEMPTS,
                "correlation_without_history": ASSUMED_CORRELATION,
                "min_paired_cells_for_a_correlation": MIN_PAIRED,
                "task_sd_without_history": ASSUMED_TASK_SD,
                "min_tasks_for_a_task_sd": MIN_TASKS,
                "rates": self.rate_rows(),
            },
            "at_trials_needed": None
            if at is None or self.trials_needed is None
            else {
                "trials": self.trials_needed,
                "attempts": at.attempts,
                "cost_usd": _as_dict(at.cost),
                "bed_seconds": _as_dict(at.bed_seconds),
                "bed_hours": _hours(at.bed_seconds),
                "wall_seconds": _as_dict(at.wall_seconds),
                "active_beds": at.active_beds,
                "pairs_without_history": len(at.without_history()),
                "pairs_without_cost": len(at.without_cost()),
            },
        }

    def note(self) -> str | None:
        """Why no trial count is given, or None when one is."""
        if len(self.models) < 2:
            return "one model: nothing to compare"
        if self.tasks < MIN_TASKS:
            return (
                f"{self.tasks} task(s): a task-clustered comparison needs at least {MIN_TASKS}; "
                "run more tasks, not more trials"
            )
        worst = self.worst
        if worst is not None and worst.trials_needed is None:
            return f"not reachable with {self.tasks} tasks at any number of trials: add tasks"
        return None

    def describe(self) -> str:
        """The plan as plain text, in the dry run's style."""
        lines = [
            f"power: to detect a difference of {self.detect:g} in pooled pass rate, paired over "
            f"(task, trial) cells, task-clustered (CR3, t on {max(self.tasks - 1, 0)} df), "
            f"two-sided alpha {self.alpha:g}, power {self.power:g}"
        ]
        note = self.note()
        if not self.pairs:
            return "\n".join([*lines, f"power: {note}"])
        if len(self.pairs) > 1:
            lines.append(
                f"{len(self.pairs)} model pairs, each tested at alpha {self.alpha_per_pair:.3g} "
                "(Bonferroni; the reports' Holm adjustment is at least as powerful)"
            )
        header = (
            "pair",
            "correlation",
            "task SD",
            "trials needed",
            f"power at {self.trials} trials",
            "at most",
        )
        rows = [header]
        for p in self.pairs:
            rows.append(
                (
                    f"{p.a} vs {p.b}",
                    f"{p.correlation.value:.2f} {p.correlation.source}",
                    f"{p.task_sd.value:.3f} {p.task_sd.source}",
                    str(p.trials_needed) if p.trials_needed is not None else "never",
                    f"{p.power_at_trials:.2f}" if self.tasks >= MIN_TASKS else "-",
                    f"{p.max_power:.2f}" if self.tasks >= MIN_TASKS else "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for row in rows:
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        worst = self.worst
        assert worst is not None
        if self.tasks < MIN_TASKS:
            lines.append(f"power: {note}{self._tasks_hint(worst)}")
        elif worst.trials_needed is None:
            lines.append(
                f"{worst.a} vs {worst.b}: not reachable with {self.tasks} tasks at any number of "
                f"trials: the difference's spread across tasks (SD {worst.task_sd.value:.3f}) caps "
                f"the power at {worst.max_power:.2f}{self._tasks_hint(worst)}: add tasks"
            )
        else:
            lines.append(
                f"needed: {worst.trials_needed} trials per (task, model) on {self.tasks} tasks "
                f"(worst pair {worst.a} vs {worst.b}); the sweep's {self.trials} give power "
                f"{worst.power_at_trials:.2f}"
            )
            lines += self._price()
        lines += self._assumptions()
        return "\n".join(lines)

    def _tasks_hint(self, worst: PairPlan) -> str:
        parts = []
        if worst.tasks_at_trials is not None:
            parts.append(f"about {worst.tasks_at_trials} tasks at {self.trials} trials")
        if worst.tasks_unlimited is not None:
            parts.append(f"{worst.tasks_unlimited} with unlimited trials")
        if not parts:
            return ""
        return f"; {', or '.join(parts)}, would reach power {self.power:g}"

    def _price(self) -> list[str]:
        at = self.at_needed
        if at is None:
            return []
        lines = [f"at {self.trials_needed} trials the sweep would add {at.attempts} attempts"]
        cost, bed, wall = at.cost, at.bed_seconds, at.wall_seconds
        if cost is not None:
            lines.append(
                f"  cost ≈ {_usd(cost.median)} (range {_usd(cost.low)}-{_usd(cost.high)}) "
                f"for {cost.attempts} of {at.attempts} attempts"
            )
        if bed is not None:
            lines.append(
                f"  bed time ≈ {bed.median / 3600:.1f} bed-hours (range {bed.low / 3600:.1f}-"
                f"{bed.high / 3600:.1f}) for {bed.attempts} of {at.attempts} attempts"
            )
            if wall is not None:
                lines.append(
                    f"  wall time ≈ {_duration(wall.median)} (range {_duration(wall.low)}-"
                    f"{_duration(wall.high)}) on the {at.active_beds} active bed(s) of pool {at.pool}"
                )
            else:
                lines.append(f"  wall time unknown: pool {at.pool} has no active bed")
        if cost is None and bed is None:
            lines.append("  cost and time unknown: no history of this sweep's (task, model) pairs")
        return lines

    def _assumptions(self) -> list[str]:
        rows = self.rate_rows()
        assumed = [r for r in rows if r["source"] == "assumed"]
        lines = ["where the figures come from (counted attempts of every sweep in the store):"]
        if len(assumed) == len(rows):
            lines.append(
                f"  rates: none in history: assumed {ASSUMED_RATE:g} for every (task, model) "
                "(the largest variance)"
            )
        else:
            line = (
                f"  rates: from history for {len(rows) - len(assumed)} of {len(rows)} (task, model)"
            )
            if assumed:
                line += (
                    f"; assumed {ASSUMED_RATE:g} for {len(assumed)} with under {MIN_ATTEMPTS} "
                    "counted attempts: "
                    + ", ".join(f"({r['task']}, {r['model']})" for r in assumed)
                )
            lines.append(line)
        for p in self.pairs:
            lines.append(
                f"  {p.a} vs {p.b}: correlation {p.correlation.value:.2f} {p.correlation.note}"
            )
            lines.append(f"  {p.a} vs {p.b}: task SD {p.task_sd.value:.3f} {p.task_sd.note}")
        return lines


def plan_power(
    store: Store,
    spec: SweepSpec,
    estimate: SweepEstimate,
    *,
    detect: float,
    power: float = DEFAULT_POWER,
    alpha: float = DEFAULT_ALPHA,
    correlation: float | None = None,
    task_sd: float | None = None,
) -> PowerPlan:
    """Plan the trials for `spec`'s model pairs; reads the store, writes nothing."""
    with store.read() as session:
        rates = _rates(session, spec)
        paired = _paired(session, spec)
    models = tuple(spec.models)
    tasks = list(spec.tasks)
    pairs = tuple(itertools.combinations(models, 2))
    per_pair_alpha = alpha / max(1, len(pairs))
    plans = []
    for a, b in pairs:
        rho = _correlation(paired.get((a, b), []), correlation)
        tau = _task_sd(tasks, a, b, rates, paired.get((a, b), []), rho.value, task_sd)
        plans.append(
            _pair_plan(
                a,
                b,
                tasks,
                rates,
                rho,
                tau,
                detect=detect,
                target=power,
                alpha=per_pair_alpha,
                trials=spec.trials,
            )
        )
    plan = PowerPlan(
        detect=detect,
        power=power,
        alpha=alpha,
        tasks=len(tasks),
        trials=spec.trials,
        models=models,
        rates=rates,
        pairs=tuple(plans),
        estimate=estimate,
        at_needed=None,
    )
    needed = plan.trials_needed
    if needed is None:
        return plan
    return dataclasses.replace(plan, at_needed=at_trials(estimate, spec.trials, needed))


def at_trials(estimate: SweepEstimate, trials: int, wanted: int) -> SweepEstimate:
    """The dry run's estimate had the spec asked `wanted` trials instead of `trials`: each
    (task, model) adds `wanted` less the attempts the sweep already holds."""
    pairs = tuple(
        dataclasses.replace(p, attempts=max(0, wanted - (trials - p.attempts)))
        for p in estimate.pairs
    )
    return dataclasses.replace(estimate, pairs=pairs)


def _pair_plan(
    a: str,
    b: str,
    tasks: list[str],
    rates: dict[tuple[str, str], Rate],
    rho: Figure,
    tau: Figure,
    *,
    detect: float,
    target: float,
    alpha: float,
    trials: int,
) -> PairPlan:
    assumed = ASSUMED_RATE * (1 - ASSUMED_RATE)

    def variance(task: str, model: str) -> float:
        found = rates.get((task, model))
        return found.variance if found else assumed

    cells = [cell_variance(variance(t, a), variance(t, b), rho.value) for t in tasks]
    within = sum(cells) / max(1, len(cells))
    between = tau.value**2
    figures = {"within": within, "between": between, "alpha": alpha}
    g = len(tasks)
    needed = trials_needed(detect, tasks=g, target=target, **figures)
    at_own = paired_power(detect, tasks=g, trials=trials, **figures)
    ceiling = paired_power(detect, tasks=g, trials=math.inf, **figures)
    return PairPlan(
        a=a,
        b=b,
        correlation=rho,
        task_sd=tau,
        within=within,
        trials_needed=needed,
        power_at_trials=at_own if g >= MIN_TASKS else 0.0,
        max_power=ceiling if g >= MIN_TASKS else 0.0,
        tasks_at_trials=tasks_needed(detect, trials=trials, target=target, **figures),
        tasks_unlimited=tasks_needed(detect, trials=math.inf, target=target, **figures),
    )


def _correlation(paired: list[tuple[str, Paired]], override: float | None) -> Figure:
    if override is not None:
        return Figure(override, "flag", "(--correlation)")
    cells = sum(p.cells for _, p in paired)
    found = within_task_correlation([p for _, p in paired])
    if cells >= MIN_PAIRED and found is not None:
        return Figure(
            found,
            "history",
            f"within tasks, from {cells} paired (sweep, task, trial) cells on {len(paired)} task(s)",
        )
    why = (
        f"{cells} paired cells in the store, {MIN_PAIRED} needed"
        if cells < MIN_PAIRED
        else f"no task's {cells} paired cells vary for both models"
    )
    return Figure(ASSUMED_CORRELATION, "assumed", f"assumed: {why} (--correlation to set)")


def _task_sd(
    tasks: list[str],
    a: str,
    b: str,
    rates: dict[tuple[str, str], Rate],
    paired: list[tuple[str, Paired]],
    correlation: float,
    override: float | None,
) -> Figure:
    if override is not None:
        return Figure(override, "flag", "(--task-sd)")
    cells = {task: p.cells for task, p in paired}
    both = [
        (rates[(t, a)], rates[(t, b)], cells.get(t, 0))
        for t in tasks
        if (t, a) in rates and (t, b) in rates
    ]
    found = between_task_variance(both, correlation)
    if found is None:
        return Figure(
            ASSUMED_TASK_SD,
            "assumed",
            f"assumed: history has rates for both models on {len(both)} of the sweep's tasks, "
            f"{MIN_TASKS} needed (--task-sd to set)",
        )
    return Figure(
        math.sqrt(found),
        "history",
        f"from the spread of the observed differences on {len(both)} tasks, less their sampling "
        "noise",
    )


def _rates(session: Session, spec: SweepSpec) -> dict[tuple[str, str], Rate]:
    """Counted attempts and passes per (task, model) over every sweep, those with enough."""
    passed = func.sum(case((Attempt.outcome == Outcome.PASSED, 1), else_=0))
    rows = session.execute(
        select(Attempt.task, Attempt.model, func.count(), passed)
        .where(
            Attempt.task.in_(spec.tasks),
            Attempt.model.in_(spec.models),
            Attempt.outcome.in_([o.value for o in COUNTED]),
        )
        .group_by(Attempt.task, Attempt.model)
    )
    return {
        (task, model): Rate(int(n), int(p or 0))
        for task, model, n, p in rows
        if int(n) >= MIN_ATTEMPTS
    }


def _paired(session: Session, spec: SweepSpec) -> dict[tuple[str, str], list[tuple[str, Paired]]]:
    """Per model pair (in the spec's order), per task: the cells of one sweep's same (task,
    trial) where both models have a counted outcome."""
    first, second = aliased(Attempt), aliased(Attempt)
    counted = [o.value for o in COUNTED]
    a_passed = case((first.outcome == Outcome.PASSED, 1), else_=0)
    b_passed = case((second.outcome == Outcome.PASSED, 1), else_=0)
    rows = session.execute(
        select(
            first.model,
            second.model,
            first.task,
            func.count(),
            func.sum(a_passed),
            func.sum(b_passed),
            func.sum(a_passed * b_passed, type_=Integer),
        )
        .select_from(first)
        .join(
            second,
            and_(
                second.sweep_id == first.sweep_id,
                second.task == first.task,
                second.trial == first.trial,
                second.model > first.model,
            ),
        )
        .where(
            first.task.in_(spec.tasks),
            first.model.in_(spec.models),
            second.model.in_(spec.models),
            first.outcome.in_(counted),
            second.outcome.in_(counted),
        )
        .group_by(first.model, second.model, first.task)
    )
    order = {m: i for i, m in enumerate(spec.models)}
    out: dict[tuple[str, str], list[tuple[str, Paired]]] = {}
    for m1, m2, task, n, s1, s2, both in rows:
        n, s1, s2, both = int(n), int(s1 or 0), int(s2 or 0), int(both or 0)
        if order[m1] < order[m2]:
            out.setdefault((m1, m2), []).append((task, Paired(n, s1, s2, both)))
        else:
            out.setdefault((m2, m1), []).append((task, Paired(n, s2, s1, both)))
    return out


def _hours(total: Total | None) -> dict[str, Any] | None:
    if total is None:
        return None
    return {
        "median": round(total.median / 3600, 6),
        "low": round(total.low / 3600, 6),
        "high": round(total.high / 3600, 6),
    }


def check_flags(
    *,
    dry_run: bool,
    detect: float | None,
    power: float | None,
    alpha: float | None,
    correlation: float | None,
    task_sd: float | None,
) -> dict[str, Any] | None:
    """The planning flags checked (BadInput naming the flag) and completed with their defaults,
    as plan_power's keywords; None without --detect."""
    if detect is None:
        for flag, value in (
            ("--power", power),
            ("--alpha", alpha),
            ("--correlation", correlation),
            ("--task-sd", task_sd),
        ):
            if value is not None:
                raise BadInput("goes with --detect", field=flag, fix="add --detect 0.05")
        return None
    if not dry_run:
        raise BadInput(
            "--detect plans a sweep: it goes with --dry-run",
            field="--detect",
            fix="add --dry-run",
        )
    power = DEFAULT_POWER if power is None else power
    alpha = DEFAULT_ALPHA if alpha is None else alpha
    for flag, value, example in (
        ("--detect", detect, "0.05 for 5 points of pass rate"),
        ("--power", power, "0.8"),
        ("--alpha", alpha, "0.05"),
    ):
        if not 0 < value < 1 or math.isnan(value):
            raise BadInput(
                f"{value:g} is not between 0 and 1 (exclusive)", field=flag, fix=f"e.g. {example}"
            )
    if power <= alpha:
        raise BadInput(
            f"power {power:g} is not above alpha {alpha:g}: any test has that much",
            field="--power",
            fix="e.g. 0.8",
        )
    if correlation is not None and not -1 <= correlation <= 1:
        raise BadInput(
            f"{correlation:g} is not a correlation", field="--correlation", fix="between -1 and 1"
        )
    if task_sd is not None and not 0 <= task_sd <= 1:
        raise BadInput(
            f"{task_sd:g} is not an SD of a difference of pass rates",
            field="--task-sd",
            fix="between 0 and 1, e.g. 0.1",
        )
    return {
        "detect": detect,
        "power": power,
        "alpha": alpha,
        "correlation": correlation,
        "task_sd": task_sd,
    }
