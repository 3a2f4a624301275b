"""The store's figures for a sweep, aggregated by the database: what the reports read.

Queries return rows in proportion to the sweep's design (tasks, models, beds, phase names), not to
its attempts; the pairing returns one row per 60 trials, streamed a task at a time, and the
envelopes' provenance is grouped from what the farm stored when it recorded them (only envelopes
stored without it are read, streamed a batch at a time). So a sweep of a million attempts costs the
report no more memory than one of ten.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.orm import Session

from apg_farm.contract import Outcome
from apg_farm.store import (
    Attempt,
    AttemptState,
    Execution,
    Phase,
    bought_sql,
    headline_counted_sql,
    headline_passed_sql,
)

#: Trials per bit mask of the pairing query: a sum of distinct powers of two below 2^60 fits the
#: signed 64-bit integers of SQLite and PostgreSQL.
WORD = 60

#: Envelopes fetched per round trip while they are streamed.
STREAM_BATCH = 500

#: A verification by `ddev ai-eval-verify`, which the agent can rewrite, instead of an escrowed
#: verifier: read from the phase's own argv, so a bed escrowed later does not whitewash it.
UNTRUSTED_VERIFY = (Phase.name == "verify_after") & cast(Phase.argv, Text).contains(
    '"ai-eval-verify"'
)


def attempt_counts(
    session: Session, sweep_id: int, *by: Any, bought: bool = False
) -> list[tuple[Any, ...]]:
    """Attempts counted per (*by, state, outcome): rows (*by values, state, outcome, count), and
    with `bought` how many of them had a second chance the agent could have bought."""
    extra = [func.sum(case((bought_sql(), 1), else_=0))] if bought else []
    return [
        tuple(row)
        for row in session.execute(
            select(*by, Attempt.state, Attempt.outcome, func.count(), *extra)
            .where(Attempt.sweep_id == sweep_id)
            .group_by(*by, Attempt.state, Attempt.outcome)
        )
    ]


#: What a cell counts, in the order of `attempt_tally`'s columns: each outcome, then the states
#: of attempts without one (an attempt is counted under its outcome, else its state upper-cased).
OUTCOME_KEYS = tuple(o.value for o in Outcome)
STATE_KEYS = tuple(s.value for s in AttemptState)


@dataclass
class Tally:
    """A sweep's attempts counted per (task, model) and, when asked, paired between models."""

    #: (task, model) -> outcome, or QUEUED / RUNNING / DONE for attempts without one -> attempts
    cells: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    #: (a, b) with a < b -> [both passed, only a, only b, neither], over the (task, trial) cells
    #: where both have a counted outcome
    pairs: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    #: The same tables per task, (a, b) -> task -> table: the clustered comparison's clusters
    task_pairs: dict[tuple[str, str], dict[str, list[int]]] = field(default_factory=dict)

    def pair(self, first: str, second: str) -> tuple[int, int, int, int]:
        """(both, only first, only second, neither) of two models, in the order asked."""
        if first > second:
            both, only_second, only_first, neither = self.pair(second, first)
            return both, only_first, only_second, neither
        a, b, c, d = self.pairs.get((first, second), (0, 0, 0, 0))
        return a, b, c, d

    def pair_by_task(self, first: str, second: str) -> dict[str, tuple[int, int, int, int]]:
        """`pair` per task, for the tasks where the two models have at least one pair."""
        swap = first > second
        tables = self.task_pairs.get((second, first) if swap else (first, second), {})
        return {
            task: (t[0], t[2], t[1], t[3]) if swap else (t[0], t[1], t[2], t[3])
            for task, t in tables.items()
        }


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.sum(case((condition, 1), else_=0))


def _trial_bits(condition: ColumnElement[bool]) -> ColumnElement[int]:
    # Bit (trial mod WORD) of the trial's word, for the attempts meeting `condition`.
    bit = cast(literal(1), BigInteger).bitwise_lshift(Attempt.trial % WORD)
    return func.sum(case((condition, bit), else_=0))


def _tally_cells(session: Session, sweep_id: int) -> dict[tuple[str, str], Counter[str]]:
    """The cells by a plain GROUP BY: any outcome or state string, however unexpected."""
    cells: dict[tuple[str, str], Counter[str]] = {}
    for task, model, state, outcome, count in attempt_counts(
        session, sweep_id, Attempt.task, Attempt.model
    ):
        cells.setdefault((task, model), Counter())[outcome or state.upper()] += count
    return cells


def attempt_tally(session: Session, sweep_id: int, *, pairs: bool = False) -> Tally:
    """The cells, and with `pairs` every pair of models, in one pass over the attempts.

    A pair is compared over the (task, trial) cells where both models have an outcome the
    headline counts, passed as the headline says (store/second_chances.py).
    The database groups the attempts by (task, model, trial // WORD) and returns, per group, the
    count of each known outcome and state and two bit masks of its trials (counted, passed); a
    pair's 2x2 table is then popcounts of the masks ANDed word by word. Rows returned: attempts
    divided by WORD, streamed one task at a time; memory holds one task's masks.
    """
    if not pairs:
        return Tally(_tally_cells(session, sweep_id))
    keys = [Attempt.outcome == key for key in OUTCOME_KEYS] + [
        Attempt.outcome.is_(None) & (Attempt.state == state) for state in STATE_KEYS
    ]
    # The pairs compare what the headline counts (store/second_chances.py): an attempt with a
    # second chance the agent could have bought is a failure, ERROR and INVALID ones included.
    bought = bought_sql()
    counted = headline_counted_sql(bought)
    word = Attempt.trial // WORD
    stmt = (
        select(
            Attempt.task,
            Attempt.model,
            word,
            func.count(),
            *(_count(key) for key in keys),
            _trial_bits(counted),
            _trial_bits(headline_passed_sql(bought)),
        )
        .where(Attempt.sweep_id == sweep_id)
        .group_by(Attempt.task, Attempt.model, word)
        .order_by(Attempt.task)
    )
    names = [*OUTCOME_KEYS, *(state.upper() for state in STATE_KEYS)]
    tally = Tally()
    words: dict[str, dict[int, tuple[int, int]]] = {}
    task_now: str | None = None
    unknown = False
    for task, model, place, total, *rest in session.execute(
        stmt, execution_options={"yield_per": STREAM_BATCH}
    ):
        if task != task_now:
            _pair_words(tally, task_now, words)
            words, task_now = {}, task
        counts = [int(v) for v in rest[: len(names)]]
        cell = tally.cells.setdefault((task, model), Counter())
        for name, count in zip(names, counts, strict=True):
            if count:
                cell[name] += count
        unknown = unknown or sum(counts) != total
        words.setdefault(model, {})[int(place)] = (int(rest[-2]), int(rest[-1]))
    _pair_words(tally, task_now, words)
    if unknown:
        # An outcome or state outside the enums: count the cells the general way.
        tally.cells = _tally_cells(session, sweep_id)
    return tally


def _pair_words(
    tally: Tally, task: str | None, words: dict[str, dict[int, tuple[int, int]]]
) -> None:
    """Add one task's trial masks, (counted, passed) per word, to every pair's 2x2 table, the
    sweep's and the task's."""
    for first, second in itertools.combinations(sorted(words), 2):
        table = [0, 0, 0, 0]
        theirs = words[second]
        for place, (c1, p1) in words[first].items():
            c2, p2 = theirs.get(place, (0, 0))
            both_counted = c1 & c2
            if not both_counted:
                continue
            both = (p1 & p2).bit_count()
            first_only = (p1 & c2).bit_count() - both
            second_only = (c1 & p2).bit_count() - both
            table[0] += both
            table[1] += first_only
            table[2] += second_only
            table[3] += both_counted.bit_count() - both - first_only - second_only
        if task is None or not sum(table):
            continue
        pooled = tally.pairs.setdefault((first, second), [0, 0, 0, 0])
        for index, count in enumerate(table):
            pooled[index] += count
        tally.task_pairs.setdefault((first, second), {})[task] = table


def sweep_executions(sweep_id: int, *columns: Any) -> Select[Any]:
    """A select of `columns` over the sweep's executions (keyed by bed id: ids group cheaply)."""
    return (
        select(*columns)
        .select_from(Execution)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(Attempt.sweep_id == sweep_id)
    )


def execution_results(session: Session, sweep_id: int) -> list[tuple[int, str | None, int]]:
    """(bed id, execution result, count) over the sweep's executions."""
    stmt = sweep_executions(sweep_id, Execution.bed_id, Execution.result, func.count()).group_by(
        Execution.bed_id, Execution.result
    )
    return [(bed, result, int(count)) for bed, result, count in session.execute(stmt)]


def phase_stats(session: Session, sweep_id: int) -> dict[str, tuple[int, float, float, float]]:
    """Per phase name: (how many the sweep's executions ran, the longest, median, p95 duration).

    PostgreSQL computes them in one pass over the phases (percentile_cont beside count and max);
    SQLite counts in one and takes the order statistics in another (`group_quantiles`)."""
    durations = phase_durations(sweep_id).subquery()
    counts = select(durations.c.key, func.count(), func.max(durations.c.value)).group_by(
        durations.c.key
    )
    if session.get_bind().dialect.name == "postgresql":
        cuts = [func.percentile_cont(q).within_group(durations.c.value) for q in (0.5, 0.95)]
        return {
            name: (int(n), float(top), float(median), float(p95))
            for name, n, top, median, p95 in session.execute(counts.add_columns(*cuts))
        }
    cuts_of = group_quantiles(session, phase_durations(sweep_id), (0.5, 0.95))
    return {
        name: (int(n), float(top), cuts_of[name][0], cuts_of[name][1])
        for name, n, top in session.execute(counts)
    }


def phase_durations(sweep_id: int) -> Select[Any]:
    """(phase name, duration) of every phase the sweep's executions ran."""
    columns: list[Any] = [Phase.name.label("key"), Phase.duration.label("value")]
    return (
        select(*columns)
        .join(Execution, Execution.id == Phase.execution_id)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(Attempt.sweep_id == sweep_id)
    )


def bed_seconds(sweep_id: int) -> Select[Any]:
    """(bed id, bed seconds) of every execution of the sweep that recorded them."""
    return sweep_executions(
        sweep_id, Execution.bed_id.label("key"), Execution.bed_seconds.label("value")
    ).where(Execution.bed_seconds.is_not(None))


def _interpolate(low: float, high: float, fraction: float) -> float:
    """R type 7 between two order statistics, as `stats.quantile` and PostgreSQL compute it."""
    return low + (high - low) * fraction


def group_quantiles(
    session: Session, values: Select[Any], qs: Sequence[float]
) -> dict[Any, list[float]]:
    """Exact R type 7 quantiles per key of `values` (a select of `key`, `value`), in the database.

    PostgreSQL has percentile_cont (the same definition); SQLite numbers each key's sorted values
    with a window and returns only the order statistics each quantile needs. Either way the rows
    stay in the database, which sorts them within its own bounded memory (spilling to disk).
    Keys without a value are absent.
    """
    source = values.subquery()
    if session.get_bind().dialect.name == "postgresql":
        aggregates = [func.percentile_cont(q).within_group(source.c.value) for q in qs]
        return {
            key: [float(v) for v in found]
            for key, *found in session.execute(
                select(source.c.key, *aggregates).group_by(source.c.key)
            )
        }
    ranked = select(
        source.c.key,
        source.c.value,
        func.row_number().over(partition_by=source.c.key, order_by=source.c.value).label("rank"),
        func.count().over(partition_by=source.c.key).label("size"),
    ).subquery()
    # 1-based ranks floor((size - 1) q) + 1 and the next one: what interpolation reads.
    wanted = []
    for q in qs:
        first = cast((ranked.c.size - 1) * cast(q, Float), Integer) + 1
        wanted += [ranked.c.rank == first, ranked.c.rank == first + 1]
    stmt = select(ranked.c.key, ranked.c.value, ranked.c.rank, ranked.c.size).where(or_(*wanted))
    order: dict[Any, dict[int, float]] = {}
    sizes: dict[Any, int] = {}
    for key, value, rank, size in session.execute(stmt):
        order.setdefault(key, {})[int(rank)] = float(value)
        sizes[key] = int(size)
    out: dict[Any, list[float]] = {}
    for key, ranks in order.items():
        found = []
        for q in qs:
            position = (sizes[key] - 1) * q
            below = math.floor(position)
            low = ranks[below + 1]
            high = ranks.get(below + 2, low)
            found.append(_interpolate(low, high, position - below))
        out[key] = found
    return out


def provenance_groups(
    session: Session, sweep_id: int, graded: Iterable[str]
) -> list[tuple[str, int, dict[str, str] | None, int]]:
    """(task, bed id, provenance, executions) over the sweep's graded executions with an
    envelope: one row per distinct provenance of a (task, bed), however many executions.
    Provenance None: envelopes whose provenance was never extracted (`unextracted_envelopes`)."""
    stmt = sweep_executions(
        sweep_id, Attempt.task, Execution.bed_id, Execution.provenance, func.count()
    ).where(Execution.result.in_(sorted(graded)), Execution.envelope.is_not(None))
    stmt = stmt.group_by(Attempt.task, Execution.bed_id, Execution.provenance)
    return [(task, bed, found, int(n)) for task, bed, found, n in session.execute(stmt)]


def unextracted_envelopes(session: Session, sweep_id: int, graded: Iterable[str]) -> Iterator[Any]:
    """(task, bed id, envelope bytes) of the sweep's graded executions whose provenance was not
    stored (written by something other than the farm's record path), streamed in batches."""
    stmt = sweep_executions(sweep_id, Attempt.task, Execution.bed_id, Execution.envelope).where(
        Execution.result.in_(sorted(graded)),
        Execution.envelope.is_not(None),
        Execution.provenance.is_(None),
    )
    yield from session.execute(stmt, execution_options={"yield_per": STREAM_BATCH})


def tune(session: Session) -> None:
    """Plan PostgreSQL's queries for a big sweep, for this read transaction only.

    At the default 4 MB of work_mem a million-execution join spills to disk in batches; 64 MB per
    sort or hash keeps it in memory, bounded. A streamed query runs as a cursor, which PostgreSQL
    plans for its first tenth of rows unless told the whole result is read. JIT compiling cost
    about 0.2 s per big query and saved less (docs/benchmarks.md: the attempt tally 2.6 -> 0.9 s
    at 1,000,000 executions), so it is off.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL work_mem = '64MB'"))
        session.execute(text("SET LOCAL cursor_tuple_fraction = 1.0"))
        session.execute(text("SET LOCAL jit = off"))
