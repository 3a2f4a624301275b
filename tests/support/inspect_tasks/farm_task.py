"""An Inspect task on the farm's beds, driven by scripted mockllm agents (tests/e2e/test_inspect_eval.py).

`inspect eval tests/support/inspect_tasks/farm_task.py --model mockllm/strong,mockllm/weak --sandbox
apg:<config.yaml>`: the samples are the APG dataset read from a bed (APG_FARM_INSPECT_BED); each
(model, task) runs the script of PLAN, each step one `bash` tool call the mockllm model makes.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.agent import as_solver, react
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.tool import bash

from apg_farm.inspect import apg_grade
from apg_farm.inspect.config import load_config
from apg_farm.inspect.dataset import apg_dataset

#: What a planted DDEV hook would create on the bed's host, had it run.
HOOK_MARKER = "/tmp/apg-farm-inspect-hook-fired"
GRADER = "web/modules/contrib/ai_eval/modules/ai_eval_droost/src/Plugin/AiEvalGrader/DroostStateGrader.php"


def build(task_id: str) -> str:
    """What a model that builds the task does to the simulated site (its `.apg-sim/site.json`)."""
    creates = {
        "dv01_view_build": ["views.view.kb_docs_index"],
        "cv01_canvas_home": ["canvas.page_region.home.header"],
        "dv02_view_filter": ["views.view.kb_search"],
    }[task_id]
    code = (
        "import json, pathlib; p = pathlib.Path('.apg-sim/site.json'); s = json.loads(p.read_text()); "
        f"s.setdefault('built', {{}})[{task_id!r}] = {{'result': 'pass', 'failed': [], "
        f"'creates': {json.dumps(creates)}, 'run_id': None}}; s['dirty'] = True; "
        "p.write_text(json.dumps(s, indent=2, sort_keys=True))"
    )
    return f"python3 -c {shlex.quote(code)}"


SCRIPTS: dict[str, Any] = {
    "build": lambda t: [build(t)],
    "idle": lambda t: [],
    "tamper": lambda t: [f"echo '// anything passes' >> {GRADER}", build(t)],
    "linger": lambda t: ["nohup sleep 600 > /dev/null 2>&1 & echo started", build(t)],
    "sleep": lambda t: ["sleep 120"],
    # `slow`: the strong model builds after a pause, the weak one only pauses (an eval set
    # interrupted while some samples are in their agents).
    "slow_build": lambda t: ["sleep 4", build(t)],
    "slow_idle": lambda t: ["sleep 4"],
    "crash": lambda t: [],
    # The provider refuses the sample's first call once (REFUSALS_VARIABLE), then it builds.
    "refused_once": lambda t: [build(t)],
    # A DDEV hook that would run on the bed's host at the next `ddev exec`, then a second call.
    "hook": lambda t: [
        "mkdir -p .ddev && printf 'hooks:\\n  pre-exec:\\n    - exec-host: touch "
        + HOOK_MARKER
        + "\\n' > .ddev/config.hook.yaml",
        "true",
    ],
}

#: (model, task) -> script; a task absent for a model idles.
PLAN = {
    ("strong", "dv01_view_build"): "build",
    ("strong", "cv01_canvas_home"): "linger",
    ("strong", "dv02_view_filter"): "build",
    ("weak", "dv01_view_build"): "idle",
    ("weak", "cv01_canvas_home"): "tamper",
    ("weak", "dv02_view_filter"): "idle",
}


#: A folder where the `refused_once` script notes each (model, task) its provider refused.
REFUSALS_VARIABLE = "APG_FARM_TEST_REFUSALS"


def scripted(commands: list[str], refuse: Path | None = None) -> Any:
    """mockllm's outputs: one bash call per command, then submit. With `refuse` not yet there,
    the first call fails as a provider that refuses it would (and `refuse` is made)."""

    def next_output(messages: list[Any], *_: Any) -> ModelOutput:
        if refuse is not None and not refuse.exists():
            refuse.touch()
            raise RuntimeError("429 Too Many Requests: the scripted provider refused the call")
        step = sum(isinstance(m, ChatMessageTool) for m in messages)
        if step < len(commands):
            output = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": commands[step]})
        else:
            output = ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"})
        # Usage given: mockllm would count tokens with tiktoken, which downloads its tables.
        output.usage = ModelUsage(input_tokens=100, output_tokens=20, total_tokens=120)
        return output

    return next_output


@solver
def scripted_agent(script: str | None = None) -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        name = str(state.model).split("/")[-1]
        task_id = str(state.metadata["apg_task"])
        chosen = script or PLAN.get((name, task_id), "idle")
        if chosen == "slow":
            chosen = "slow_build" if name == "strong" else "slow_idle"
        refuse = None
        if chosen == "refused_once":
            refuse = Path(os.environ[REFUSALS_VARIABLE]) / f"{name}-{task_id}"
        model = get_model(
            "mockllm/model",
            custom_outputs=scripted(SCRIPTS[chosen](task_id), refuse),
            memoize=False,
        )
        agent = react(tools=[bash(timeout=180)], model=model)
        state = await as_solver(agent)(state, generate)
        if chosen == "crash":
            # The solver fails after the agent acted: Inspect records a sample error.
            raise RuntimeError("the scripted solver crashed after its agent acted")
        return state

    return solve


@task
def farm_task(script: str | None = None, tasks: str = "") -> Task:
    return farm_task_of(script, tasks)


#: Private Inspect APIs the provider reads, broken here ("module:name,...") as a newer Inspect
#: could break them: the provider must judge the sample and free the bed all the same (#32).
BREAK_VARIABLE = "APG_FARM_TEST_BREAK_INSPECT"


def _break_private_apis() -> None:
    import importlib

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("this Inspect has no such API (broken by the test)")

    for spec in filter(None, os.environ.get(BREAK_VARIABLE, "").split(",")):
        module, name = spec.split(":")
        setattr(importlib.import_module(module), name, broken)


def farm_task_of(script: str | None, tasks: str) -> Task:
    _break_private_apis()
    config = load_config(os.environ.get("APG_FARM_INSPECT_CONFIG"))
    dataset = apg_dataset(
        "droost_build_tasks", bed=os.environ["APG_FARM_INSPECT_BED"], config=config
    )
    wanted = [t for t in tasks.split(",") if t] or list(PLAN_TASKS)
    dataset = dataset.filter(lambda s: s.id in wanted)
    return Task(dataset=dataset, solver=scripted_agent(script), scorer=apg_grade())


PLAN_TASKS = ("dv01_view_build", "cv01_canvas_home", "dv02_view_filter")
