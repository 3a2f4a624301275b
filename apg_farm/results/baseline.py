"""Baselines: a sweep's results promoted to a compact, git-friendly JSON file.

A baseline keeps metrics, counts and provenance (fingerprints, seal), never raw outputs, and the
tasks marked indispensable with the pass rate each must keep. Its `content_sha256` covers
everything else in the file, so an edited baseline is noticed by `apg-farm check`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apg_farm import __version__
from apg_farm.errors import BadInput, NotFound
from apg_farm.specs import NAME
from apg_farm.store import utcnow

FORMAT = "apg-farm-baseline/1"

#: Baseline names become file names: keep them portable.

#: Keys of an analysis a baseline keeps; phases and beds describe the farm, not the models.
_KEPT = (
    "sweep",
    "k",
    "outcomes",
    "cells",
    "models",
    "comparisons",
    "provenance",
    "second_chance",
    # The bed baselines (code versions) behind the results: `check` pairs only equal ones.
    "bed_baselines",
)


def content_digest(doc: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `doc` without its own `content_sha256`."""
    body = {k: v for k, v in doc.items() if k != "content_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def parse_indispensable(values: list[str]) -> dict[str, float]:
    """`TASK` (every counted attempt must pass) or `TASK=MIN_RATE` (a floor in (0, 1])."""
    gates: dict[str, float] = {}
    for value in values:
        task, sep, floor = value.partition("=")
        task = task.strip()
        if not task:
            raise BadInput(f"{value!r} names no task", field="--indispensable")
        rate = 1.0
        if sep:
            try:
                rate = float(floor)
            except ValueError:
                rate = -1.0
            if not 0.0 < rate <= 1.0:
                raise BadInput(
                    f"{value!r}: the minimum pass rate must be a number in (0, 1]",
                    field="--indispensable",
                    fix="write TASK or TASK=0.8",
                )
        gates[task] = rate
    return gates


def build_baseline(
    analysis: dict[str, Any],
    *,
    name: str,
    indispensable: dict[str, float] | None = None,
    notes: str | None = None,
) -> dict[str, Any]:
    """The baseline document for an analysis (see `apg_farm.results.analysis.analyse`)."""
    if not NAME.fullmatch(name):
        raise BadInput(
            f"{name!r} is not a usable baseline name",
            field="--name",
            fix="use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    gates = dict(sorted((indispensable or {}).items()))
    tasks = {c["task"] for c in analysis["cells"]}
    unknown = sorted(set(gates) - tasks)
    if unknown:
        raise BadInput(
            f"indispensable task(s) {', '.join(unknown)} are not in sweep "
            f"{analysis['sweep']['name']!r}",
            field="--indispensable",
            fix=f"choose among {', '.join(sorted(tasks))}",
        )
    doc: dict[str, Any] = {
        "format": FORMAT,
        "name": name,
        "promoted_at": utcnow().isoformat(timespec="seconds"),
        "farm_version": __version__,
        "notes": notes,
        "indispensable": gates,
        **{key: analysis[key] for key in _KEPT if key in analysis},
    }
    doc["content_sha256"] = content_digest(doc)
    return doc


def write_baseline(doc: dict[str, Any], directory: Path, *, replace: bool = False) -> Path:
    """Write `<directory>/<name>.json`: sorted keys, two-space indent, one trailing newline."""
    path = directory / f"{doc['name']}.json"
    if path.exists() and not replace:
        raise BadInput(
            f"baseline {path} exists",
            field="--name",
            fix="choose another --name, or pass --replace to overwrite it deliberately",
        )
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class LoadedBaseline:
    """A baseline read from disk, and whatever about it does not verify."""

    path: Path
    doc: dict[str, Any]
    problems: tuple[str, ...]

    @property
    def sealed(self) -> bool:
        """Whether its sweep was sealed when it was promoted (the seal's digest is in it)."""
        return is_sealed(self.doc)

    @property
    def verifies(self) -> bool:
        """True only when something beyond the file vouches for it: its digest matches and its
        sweep was sealed. A digest alone is recomputed by whoever edits the file."""
        return not self.problems and self.sealed

    def evidence(self) -> str:
        """What its evidence rests on, in the words `baseline list` prints."""
        if self.problems:
            return "does not verify: edited after promotion"
        if not self.sealed:
            return "unverified: its sweep was not sealed (the file's own digest only)"
        seal = str(self.doc["provenance"]["seal_sha256"])
        return f"sealed sweep (seal {seal[:12]}), digest matches"


def is_sealed(doc: dict[str, Any]) -> bool:
    """Whether a baseline document records its sweep's seal."""
    provenance = doc.get("provenance")
    return isinstance(provenance, dict) and bool(provenance.get("seal_sha256"))


def unsealed_warning(label: str) -> str:
    """The warning `check` and `compare` give a baseline whose sweep was not sealed."""
    return (
        f"{label} comes from a sweep that was not sealed: nothing but the file's own digest "
        "vouches for its figures (seal the sweep, then promote it again)"
    )


def load_baseline(path: Path) -> LoadedBaseline:
    """Read a baseline; a malformed file is bad input, an edited one a problem to report."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"no baseline file {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BadInput(f"{path} is not a readable JSON baseline: {error}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadInput(
            f"{path} is not an apg-farm baseline (format {FORMAT!r})",
            fix="create one with `apg-farm baseline promote SWEEP --name NAME`",
        )
    for key in ("cells", "outcomes", "sweep"):
        if key not in doc:
            raise BadInput(f"{path} has no {key!r}: not a complete baseline")
    problems = []
    recorded = doc.get("content_sha256")
    if recorded != content_digest(doc):
        problems.append(
            f"baseline {path} does not match its content_sha256 (edited after promotion)"
        )
    return LoadedBaseline(path, doc, tuple(problems))
