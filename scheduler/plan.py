"""Expanding a sweep into attempts, in an order that keeps a half-finished sweep comparable."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from apg_farm.specs import SweepSpec


@dataclass(frozen=True, order=True)
class AttemptKey:
    """The unique key of an attempt within its sweep, and its place in the queue."""

    seq: int
    task: str
    model: str
    trial: int


def expand(spec: SweepSpec) -> list[AttemptKey]:
    """Every (task, model, trial), trial-major so models and tasks interleave (see iter_keys)."""
    return list(iter_keys(spec))


def iter_keys(spec: SweepSpec) -> Iterator[AttemptKey]:
    """Every (task, model, trial) in queue order, one at a time: a million-attempt sweep is
    never held whole.

    Trial 1 of every (task, model) comes before trial 2 of any: a sweep stopped half way has
    about the same number of samples for every model on every task. Within a trial the model
    order rotates with the task so no model is always first on a freshly started pool.
    """
    models = list(spec.models)
    seq = 0
    for trial in range(1, spec.trials + 1):
        for t, task in enumerate(spec.tasks):
            shift = (t + trial - 1) % len(models)
            for model in models[shift:] + models[:shift]:
                yield AttemptKey(seq, task, model, trial)
                seq += 1
