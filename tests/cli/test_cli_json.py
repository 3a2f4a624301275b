"""The JSON convention (#23): every command that prints a result takes `--json` and then prints
one JSON document on stdout and nothing else there; `--format json` stays where it was, the
same document. Each command is run as a process on a store with simulated beds and sweeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from apg_farm.cli import app
from apg_farm.results import find_sweep, seal
from apg_farm.scheduler import submit
from apg_farm.store import Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import make_beds, spec

#: Commands without --json, and why: they say one line of what they did (the exit code is the
#: answer), or they are services, or their output is for a person (`report --json` follows).
NO_JSON = {
    "bed add": "one line: the bed added",
    "bed escrow": "one line: the set recorded",
    "bed release": "one line: the bed active again",
    "model release": "one line: the model running again",
    "sweep cancel": "one line: how many were cancelled",
    "sweep retry": "one line: how many were queued again",
    "sweep set-priority": "one line: the new weight",
    "sweep delete": "one line: what was deleted",
    "baseline promote": "one line: the file written",
    "db upgrade": "one line: the store is up to date",
    "demo": "tables for a person; `report NAME --json` after",
    "serve": "a service",
    "worker": "a service",
    "scheduler": "a service: one log line per pass",
}


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    subs = getattr(command, "commands", None)
    if not subs:
        yield " ".join(path), command
        return
    for name, sub in subs.items():
        yield from _leaves(sub, (*path, name))


def test_every_command_has_json_or_a_reason() -> None:
    """The inventory: each command takes --json, or is named above with why not; a command with
    --format takes --json as well."""
    commands = dict(_leaves(typer.main.get_command(app)))
    for name, command in commands.items():
        flags = {opt for param in command.params for opt in param.opts}
        if name in NO_JSON:
            assert "--json" not in flags, f"{name} has --json now: take it out of NO_JSON"
        else:
            assert "--json" in flags, f"`apg-farm {name}` has no --json (nor a reason in NO_JSON)"
    # Every command named here must exist.
    assert set(NO_JSON) <= set(commands)


@dataclass
class Farm:
    env: dict[str, str]
    root: Path
    store: Store


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """Two simulated beds, a finished sweep `j-done`, a sealed one `j-sealed`, a finished one
    to seal `j-seal`, and a sweep file `j-run.yaml` not yet submitted."""
    root = tmp_path_factory.mktemp("json")
    url = f"sqlite:///{root / 'farm.db'}"
    store = Store(url)
    make_beds(store, root, 2)
    for name in ("j-done", "j-sealed", "j-seal"):
        sweep_id = submit(store, spec(name, tasks=1, trials=1)).sweep_id
        assert not EmbeddedExecutor(store, sweep_id).run().errors
    seal(store, find_sweep(store, "j-sealed").id, directory=root / "seals")
    (root / "j-run.yaml").write_text(
        yaml.safe_dump(spec("j-run", tasks=1, trials=1).model_dump(mode="json"))
    )
    (root / "upgrade.sh").write_text("#!/bin/sh\ntrue\n")
    yield Farm(store_env(root / "home", url), root, store)
    store.dispose()


def _one_document(farm: Farm, *args: str, code: int = 0) -> Any:
    """`apg-farm ARGS`: stdout is exactly one JSON document."""
    done = run_process(farm.env, *args, code=code)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError(f"stdout is not one JSON document ({error}):\n{done.stdout}") from None


def test_run_resume_and_submit_print_one_document(farm: Farm) -> None:
    """`run --json` (its submission line and progress off stdout), `sweep resume --json`,
    `sweep submit --json` with and without --dry-run."""
    sweep_file = str(farm.root / "j-run.yaml")
    estimate = _one_document(farm, "sweep", "submit", sweep_file, "--dry-run", "--json")
    assert "attempts" in json.dumps(estimate)
    ran = _one_document(farm, "run", sweep_file, "--json")
    assert ran["ok"] is True and ran["submitted"]["created"] == 2
    assert (
        ran["report"]["sweep"]["name"] == "j-run" and sum(ran["report"]["outcomes"].values()) == 2
    )
    # The verdict: a line per model pair and per model.
    models = {cell["model"] for cell in ran["report"]["cells"]}
    assert sum(" n = " in line for line in ran["verdict"]) == len(models)
    resumed = _one_document(farm, "sweep", "resume", "j-run", "--json")
    assert resumed["submitted"] is None and resumed["report"] == ran["report"]
    again = _one_document(farm, "sweep", "submit", sweep_file, "--json")
    assert again == {
        "submitted": {**ran["submitted"], "created": 0, "existing": 2, "new_sweep": False},
        "dispatched": None,
    }


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (["report", "j-done", "--json"], lambda d: d["sweep"]["name"] == "j-done"),
        (["compare", "j-done", "j-seal", "--json"], lambda d: d["a"] and "models" in d),
        (["check", "j-done", "j-done", "--json"], lambda d: d["ok"] is True),
        (["sweep", "status", "j-done", "--json"], lambda d: d["states"]["done"] == 2),
        (["verify", "j-sealed", "--json"], lambda d: d["ok"] is True and d["checked"] > 0),
        (["bed", "list", "--json"], lambda d: [b["name"] for b in d] == ["bed0", "bed1"]),
        (["bed", "doctor", "bed0", "--json"], lambda d: d["healthy"] is True),
        (["bed", "canary", "bed0", "--json"], lambda d: d["bed"] == "bed0"),
        (["budget", "show", "--json"], lambda d: d["daily"]["limit_usd"] is None),
        (["baseline", "list", "--dir", "/nonexistent", "--json"], lambda d: d == []),
        (
            ["pool", "upgrade", "POOL", "--run", "UPGRADE", "--dry-run", "--json"],
            lambda d: d["dry_run"] is True and len(d["beds"]) == 2,
        ),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else "",
)
def test_read_commands_print_one_document(farm: Farm, args: list[str], check: Any) -> None:
    """Each read command's --json: one document, the figures it names."""
    with farm.store.read() as session:
        from sqlalchemy import select

        from apg_farm.store import Bed

        pool = session.scalar(select(Bed.pool).where(Bed.name == "bed0"))
    args = [str(farm.root / "upgrade.sh") if a == "UPGRADE" else a for a in args]
    args = [pool or "" if a == "POOL" else a for a in args]
    assert check(_one_document(farm, *args))


def test_format_json_is_the_same_as_json(farm: Farm) -> None:
    """`--format json` kept where it was (report, compare, check): the same document as --json;
    --json beside another format is refused."""
    for args in (
        ["report", "j-done"],
        ["compare", "j-done", "j-seal"],
        ["check", "j-done", "j-done"],
    ):
        by_flag = _one_document(farm, *args, "--json")
        by_format = _one_document(farm, *args, "--format", "json")
        by_flag.pop("generated_at", None), by_format.pop("generated_at", None)
        assert by_flag == by_format, args
    refused = run_process(farm.env, "report", "j-done", "--json", "--format", "csv", code=2)
    assert "--json" in refused.stderr and refused.stdout == ""


def test_write_commands_print_one_document(farm: Farm) -> None:
    """seal, export, budget set/clear, beds apply --dry-run and bed clone: one document each."""
    sealed = _one_document(farm, "seal", "j-seal", "--dir", str(farm.root / "seals"), "--json")
    assert sealed["sweep"] == "j-seal" and Path(sealed["manifest"]).is_file()
    assert len(sealed["sha256"]) == 64
    exported = _one_document(farm, "export", "j-done", "--eee", str(farm.root / "eee"), "--json")
    assert exported["eee"]["attempts"] == 2 and exported["inspect"] is None
    budget = _one_document(farm, "budget", "set", "--daily", "50", "--json")
    assert budget["daily"]["limit_usd"] == 50
    cleared = _one_document(farm, "budget", "clear", "--daily", "--json")
    assert cleared["daily"]["limit_usd"] is None
    from apg_farm.beds import list_beds

    inventory = {
        "defaults": {"host_only": True},
        "beds": [
            {
                "name": b.name,
                "approot": b.approot,
                "ddev": b.ddev,
                "env": dict(b.env),
                "escrow_set": b.escrow_set,
            }
            for b in list_beds(farm.store)
        ],
    }
    (farm.root / "beds.yaml").write_text(yaml.safe_dump(inventory))
    applied = _one_document(
        farm, "beds", "apply", str(farm.root / "beds.yaml"), "--dry-run", "--json"
    )
    assert applied["dry_run"] is True and {c["action"] for c in applied["changes"]} == {"keep"}
    cloned = _one_document(farm, "bed", "clone", "bed1", "bed9", "--json")
    assert cloned["enrolled"] is True and cloned["bed"] == "bed9"


def test_bed_doctor_speaks_to_people_unless_asked_for_json(farm: Farm) -> None:
    """`bed doctor` without --json: the verdict and its checks as lines, no JSON."""
    done = run_process(farm.env, "bed", "doctor", "bed0")
    assert done.stdout.startswith("bed bed0: healthy") and "ok   baseline" in done.stdout
    assert "{" not in done.stdout
