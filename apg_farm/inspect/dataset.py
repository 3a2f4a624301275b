"""An Inspect dataset of an APG dataset's tasks, read from a bed of the farm.

`apg_dataset("droost_build_tasks", bed="bed-1")` reads the dataset file the bed's grader resolves,
through the bed's own transport (local or SSH). APG keeps a dataset in an enabled module's
`datasets/` folder (AI Eval's rule), so the file is looked for under the project's `web/` as
`*/datasets/<name>.dataset.{json,yml,yaml}` or `*/datasets/<name>.{json,yml,yaml}`; exactly one
must match (else `path=` names it, relative to the project). The grade envelope's `dataset_path`
names the file a grade read: give that as `path=` to be sure it is the same one.

One Sample per question (`questions`, or `tasks`: each an `id` and a `prompt`), its id the APG
task id, its input the prompt, and in its metadata the task, the dataset and the prompt's sha256.

The file is read from the bed's project, which agents can write: read it from a bed at baseline
(after `apg-farm bed doctor`), or give your own Inspect dataset (sample ids or `apg_task`).
"""

from __future__ import annotations

import hashlib

import yaml
from inspect_ai.dataset import MemoryDataset, Sample
from sqlalchemy import select

from apg_farm.contract import SAFE_ARG
from apg_farm.errors import BadInput, NotFound
from apg_farm.inspect.config import ApgConfig
from apg_farm.inspect.sandbox import store_for
from apg_farm.store import Bed
from apg_farm.transports import Transport, transport_for

#: The names a dataset file may have in a module's datasets/ folder.
SUFFIXES = (".dataset.json", ".dataset.yml", ".dataset.yaml", ".json", ".yml", ".yaml")
#: The largest dataset file read.
DATASET_LIMIT = 8 << 20


def apg_dataset(
    name: str, *, bed: str, path: str | None = None, config: ApgConfig | None = None
) -> MemoryDataset:
    """The APG dataset `name` as Inspect samples, read from bed `bed` of the farm's store."""
    if not SAFE_ARG.fullmatch(name) or "/" in name:
        raise BadInput(f"dataset name {name!r} is not a dataset name", field="name")
    store = store_for(config or ApgConfig())
    with store.read() as session:
        row = session.scalar(select(Bed).where(Bed.name == bed))
        if row is None:
            raise NotFound(f"no bed named {bed!r}", field="bed", fix="see `apg-farm bed list`")
        session.expunge(row)
    transport = transport_for(row)
    try:
        found = f"{row.approot}/{path}" if path else _find(transport, row.approot, name, bed)
        data = transport.read_file(found, limit=DATASET_LIMIT + 1)
    finally:
        transport.close()
    if data is None:
        raise NotFound(f"bed {bed}: cannot read the dataset file {found}", field="path")
    return samples_of(data, name, source=f"bed {bed}: {found}")


def _find(transport: Transport, approot: str, name: str, bed: str) -> str:
    """The one dataset file named `name` under the project's web/ folder."""
    names = [f"{name}{suffix}" for suffix in SUFFIXES]
    tests: list[str] = []
    for candidate in names:
        tests += ["-o", "-name", candidate] if tests else ["-name", candidate]
    argv = [
        "find",
        f"{approot}/web",
        "-maxdepth",
        "10",
        "-type",
        "f",
        "-path",
        "*/datasets/*",
        "(",
        *tests,
        ")",
    ]
    result = transport.run(
        argv,
        cwd=approot,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
        stdout_limit=64 * 1024,
        stderr_limit=4096,
    )
    found = sorted(line for line in result.stdout.text().splitlines() if line)
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(
            f"bed {bed}: no dataset {name} under {approot}/web (*/datasets/{name}.*)",
            field="name",
            fix="name the file with path= (relative to the project), as the grade envelope's "
            "dataset_path says",
        )
    raise BadInput(
        f"bed {bed}: {len(found)} files could be dataset {name}: {', '.join(found[:5])}",
        field="path",
        fix="name the one the grade reads with path= (the grade envelope's dataset_path)",
    )


def samples_of(data: bytes, name: str, *, source: str) -> MemoryDataset:
    """Samples of a dataset file's questions (`questions: [{id, prompt}, ...]`)."""
    if len(data) > DATASET_LIMIT:
        raise BadInput(f"{source}: larger than {DATASET_LIMIT} bytes")
    try:
        doc = yaml.safe_load(data.decode("utf-8"))  # JSON is YAML too
        questions = doc.get("questions", doc.get("tasks"))
        pairs = [(str(q["id"]), str(q["prompt"])) for q in questions]
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as error:
        raise BadInput(f"{source}: not an APG dataset ({type(error).__name__}: {error})") from None
    samples = []
    for task, prompt in pairs:
        if not SAFE_ARG.fullmatch(task):
            raise BadInput(f"{source}: task id {task!r} is not one a bed can take")
        digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        metadata = {"apg_task": task, "apg_dataset": name, "apg_prompt_sha256": digest}
        samples.append(Sample(id=task, input=prompt, metadata=metadata))
    return MemoryDataset(samples, name=name)
