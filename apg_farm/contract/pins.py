"""What the grade reads, pinned: an envelope's dataset and task hashes against a grade at baseline.

APG advises keeping the task dataset in the project's own module (`datasets/` of a custom
module), which the escrow verifier does not cover: an agent can edit its own task's entry (drop
the assertions its build fails) and the grade then passes what it built. The envelope names what
the grade read (`dataset_sha256`, `task_sha256`; or `dataset_provenance: "unresolved: …"`), so the
farm pins both per bed baseline from a grade no agent could have influenced (a grade right after
the reset and the baseline checks, before the run, or a canary's) and judges every later
envelope of that task on that baseline against the pin:

- other hashes than the pin: TAMPERED, both hashes in the reason, the bed quarantined (an
  untracked custom module keeps the edit through every reset: not fit until a person looks);
- no hashes where the pin has them: TAMPERED too. APG omits them only when the dataset could not
  be resolved, parsed or cross-checked; at baseline it could, and since then only the agent
  acted (outcomes.py's rule: what it could have caused counts against it). FAILED would count the
  same in the pass rate but leave the bed in service with a dataset nobody can identify, whose
  next grade would judge another model by it;
- hashes where the pin has none (the task skipped, or unresolved, at baseline): TAMPERED, the
  grade reads something it did not read at baseline (an agent that wrote a droost spec into a
  task without one).

The first grade on a verified bed is **not** a source: the verifier does not cover a custom
module's dataset, so the agent of that very attempt may already have edited it, and pinning its
grade would bless the edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from apg_farm.contract.outcomes import Outcome, Verdict, with_quarantine
from apg_farm.contract.provenance import bounded

if TYPE_CHECKING:
    from apg_farm.contract.envelope import Grade

#: The envelope's fields a pin holds.
PINNED_FIELDS = ("dataset_sha256", "task_sha256")
#: Why a pin holds no hashes when the grade at baseline skipped the task.
SKIPPED_AT_BASELINE = "skipped at baseline (APG_GRADE_SKIP): no envelope, no hashes"


@dataclass(frozen=True)
class DatasetRead:
    """What one grade says it read: the hashes (None when not named) and, when none, why."""

    dataset_sha256: str | None
    task_sha256: str | None
    dataset_path: str | None = None
    note: str | None = None

    def hashes(self) -> tuple[str | None, str | None]:
        return self.dataset_sha256, self.task_sha256

    def shown(self) -> str:
        """Both hashes in full (the evidence), or why there are none."""
        if self.dataset_sha256 is None and self.task_sha256 is None:
            return f"no hashes ({self.note or 'not named'})"
        return f"dataset_sha256 {self.dataset_sha256 or '-'}, task_sha256 {self.task_sha256 or '-'}"


def read_of(grade: Grade) -> DatasetRead:
    """What an envelope the farm accepted says the grade read (bounded: it is the bed's output)."""

    def field(name: str) -> str | None:
        value = grade.provenance.get(name)
        return bounded(value) if isinstance(value, str) and value else None

    unresolved = field("dataset_provenance")
    return DatasetRead(
        dataset_sha256=field("dataset_sha256"),
        task_sha256=field("task_sha256"),
        dataset_path=field("dataset_path"),
        note=unresolved or (None if field("dataset_sha256") else "the envelope names no hashes"),
    )


def skipped_read() -> DatasetRead:
    """A grade at baseline that skipped the task: nothing read that the farm can name."""
    return DatasetRead(None, None, note=SKIPPED_AT_BASELINE)


def pin_problem(pin: DatasetRead, read: DatasetRead) -> str | None:
    """How `read` departs from `pin` (None: it names exactly the pinned hashes)."""
    if read.hashes() == pin.hashes():
        return None
    where = f" ({pin.dataset_path})" if pin.dataset_path else ""
    if read.dataset_sha256 is None and read.task_sha256 is None:
        return (
            f"the envelope names no dataset or task hash ({read.note or 'not named'}); "
            f"pinned at baseline{where}: {pin.shown()}"
        )
    return f"the envelope names {read.shown()}; pinned at baseline{where}: {pin.shown()}"


def judge_pinned(verdict: Verdict, *, pin: DatasetRead | None, grade: Grade | None) -> Verdict:
    """The grade's verdict against the pin of its task on its baseline: TAMPERED, the bed
    quarantined with both hashes, when the envelope the farm accepted names other hashes than the
    pin or none where the pin has them. A verdict without an envelope (a skip, a refusal, a
    grade that could not run) and a task with no pin yet are left as they are."""
    if pin is None or grade is None or verdict.outcome not in _JUDGED:
        return verdict
    problem = pin_problem(pin, read_of(grade))
    if problem is None:
        return verdict
    tampered = Verdict(
        "final",
        f"the grade read another dataset than its baseline's: {problem} "
        f"(it would have said {verdict.outcome}: {verdict.reason})",
        outcome=Outcome.TAMPERED,
    )
    return with_quarantine(
        with_quarantine(tampered, verdict.quarantine),
        f"dataset changed during an attempt: {problem}; the dataset may stay edited (an untracked "
        "custom module keeps it through reset): restore it, then `apg-farm bed release`",
    )


#: The verdicts an envelope gave (the only ones with hashes to judge).
_JUDGED = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.NO_ATTEMPT})
