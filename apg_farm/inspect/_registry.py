"""Inspect's entry point (`[project.entry-points.inspect_ai]`): importing it registers `apg`."""

from apg_farm.inspect.sandbox import ApgSandboxEnvironment
from apg_farm.inspect.scorer import apg_grade

__all__ = ["ApgSandboxEnvironment", "apg_grade"]
