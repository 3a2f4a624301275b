"""A second Inspect task over farm_task's samples (#32): the same APG ids, models and epochs,
with an agent that does nothing, as two solvers compared in one run are. In a file of its own:
`inspect eval FILE` runs every task of the file, and the other tests run farm_task.py alone."""

from __future__ import annotations

import sys
from pathlib import Path

from inspect_ai import Task, task

# Inspect loads a task file by its path, with nothing added to sys.path: its sibling is found here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from farm_task import farm_task_of


@task
def farm_task_idle(script: str | None = None, tasks: str = "") -> Task:
    return farm_task_of("idle", tasks)
