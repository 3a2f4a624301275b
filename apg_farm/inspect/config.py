"""The `apg` sandbox's configuration: which store, which pool, which beds, which limits.

Given to Inspect as `sandbox=("apg", "apg.yaml")` (a YAML file), `sandbox=("apg", ApgConfig(...))`
or a mapping (`config_deserialize`). Every problem is one BadInput naming the field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apg_farm.contract import DEFAULT_POLICY
from apg_farm.defaults import DEFAULT_FIXTURES
from apg_farm.errors import BadInput, NotFound
from apg_farm.specs import (
    SafeArg,
    SafeList,
    SweepName,
    Timeouts,
    describe_validation_error,
    pool_key,
)


class ApgConfig(BaseModel):
    """Where the `apg` sandbox takes its beds from, and how it runs a sample on one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fixtures: SafeList = Field(default_factory=lambda: list(DEFAULT_FIXTURES))
    """The pool: the fixture set its beds were provisioned with (as in a sweep file)."""
    database_url: str | None = None
    """The farm's store; by default APG_FARM_DATABASE_URL, else the embedded one."""
    beds: list[SafeArg] | None = None
    """Only these beds of the pool (by name); by default every active one."""
    sweep: SweepName | None = None
    """The sweep the run's samples are recorded in; by default one per Inspect run,
    `inspect-<run id>`. Naming one lets a later run add to it."""
    dataset: SafeArg | None = None
    """The APG dataset graded against, unless a sample's metadata names one (`apg_dataset`)."""
    retries: int = Field(default=2, ge=0, le=20)
    """Infrastructure retries of one sample's attempt (as a sweep's `retries`)."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Seconds for the farm's phases (verify, reset, grade); `run` bounds a sample's agent."""
    lease_seconds: float = Field(default=DEFAULT_POLICY.lease_seconds, ge=5, le=3600)
    """The claim's lease, renewed while the sample runs."""
    wait_for_bed: float = Field(default=3600, ge=0, le=7 * 86400)
    """Seconds `sample_init` waits for a free bed of the pool before it gives up."""

    @property
    def pool(self) -> str:
        return pool_key(self.fixtures)

    def sweep_name(self, run_id: str | None, task_name: str) -> str:
        """The configured sweep, else one per Inspect run (its eval set's id, which its retries
        keep, or its run id), else per task. The sweep belongs to the Inspect task whose sample
        made it; another task of the run gets `task_sweep_name` (sample_bed.py)."""
        if self.sweep:
            return self.sweep
        return ("inspect-" + _safe(run_id or task_name))[:100]


def task_sweep_name(sweep: str, task_name: str) -> str:
    """The sweep of an Inspect task whose run's sweep another of its tasks holds: the same
    (APG task, model, epoch) of two Inspect tasks are two attempts, counted in two sweeps."""
    return f"{sweep[: 99 - min(len(task_name), 40)]}.{_safe(task_name)[:40]}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)


def parse_config(data: Any, *, source: str = "apg sandbox config") -> ApgConfig:
    if data is None:
        return ApgConfig()
    if isinstance(data, ApgConfig):
        return data
    if isinstance(data, BaseModel):
        data = data.model_dump()
    if not isinstance(data, dict):
        raise BadInput(
            f"{source}: a mapping of keys (fixtures, beds, sweep, dataset, ...) is wanted",
            field=source,
        )
    try:
        config = ApgConfig.model_validate(data)
    except ValidationError as error:
        raise BadInput(describe_validation_error(error, source=source)) from None
    return config


def load_config(config: Any) -> ApgConfig:
    """The config Inspect hands the provider: None, a model, a mapping, or a YAML file's path."""
    if not isinstance(config, str):
        return parse_config(config)
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(
            f"apg sandbox config: no such file: {config}",
            field="config",
            fix="give the path of a YAML file (fixtures:, beds:, sweep:, ...)",
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"apg sandbox config: cannot read {config}: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadInput(f"{config}: invalid YAML: {error}", fix="correct the YAML syntax") from None
    return parse_config(data, source=config)
