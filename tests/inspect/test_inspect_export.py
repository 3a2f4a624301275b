"""A farm sweep as Inspect eval logs (`apg-farm export --inspect`), and Inspect kept optional."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.log import list_eval_logs, read_eval_log

from apg_farm.errors import BadInput, NotFound
from apg_farm.inspect.config import load_config, parse_config
from tests.cli.test_cli import farm

INSPECT = Path(sys.executable).with_name("inspect")


def test_the_demos_sweep_exported_as_inspect_logs_reads_back_with_the_reports_counts(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    done = farm(home, "demo", "--trials", "2", "--time-scale", "2000")
    name = re.findall(r"apg-farm report (\S+)", done.stdout)[-1]
    report = json.loads(farm(home, "report", name, "--format", "json").stdout)
    out = tmp_path / "logs"
    exported = farm(home, "export", name, "--inspect", str(out)).stdout
    assert "Inspect logs" in exported

    logs = [read_eval_log(info) for info in list_eval_logs(str(out))]
    models = {cell["model"] for cell in report["cells"]}
    assert sorted(log.eval.model for log in logs) == sorted(models)
    samples = [(log.eval.model, s) for log in logs for s in log.samples or []]
    # Every attempt is a sample, each outcome where the report counts it.
    assert len(samples) == report["sweep"]["attempts"]
    assert Counter(s.metadata["apg_outcome"] for _, s in samples) == Counter(report["outcomes"])
    for cell in report["cells"]:
        mine = [s for m, s in samples if m == cell["model"] and s.id == cell["task"]]
        scored = [s for s in mine if s.scores]
        assert len(scored) == cell["n"]
        assert sum(s.scores["apg_grade"].value == "C" for s in scored) == cell["passed"]
    for log in logs:
        cells = [c for c in report["cells"] if c["model"] == log.eval.model]
        rate = sum(c["passed"] for c in cells) / sum(c["n"] for c in cells)
        assert log.results is not None
        assert log.results.scores[0].metrics["accuracy"].value == pytest.approx(rate)
        dumped = subprocess.run(
            [str(INSPECT), "log", "dump", str(log.location)], capture_output=True, text=True
        )
        assert dumped.returncode == 0, dumped.stderr
        assert json.loads(dumped.stdout)["eval"]["model"] == log.eval.model


def test_export_needs_a_destination(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = farm(home, "export", "anything", check=2)
    assert "--eee/--inspect" in done.stderr


def test_the_cli_and_the_demo_never_import_inspect() -> None:
    """Inspect is an optional extra: `apg-farm --help` and the demo's modules work without it."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['apg-farm', '--help']\n"
        "import apg_farm.cli.app, apg_farm.cli.demo, apg_farm.cli.attacks, apg_farm.workers\n"
        "try:\n"
        "    runpy.run_module('apg_farm', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('inspect_ai', 'apg_farm') and 'inspect' in m.split('.')[-1] or m.startswith('inspect_ai')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"fixtures": ["kb docs"]}, "fixtures"),
        ({"pool": "x"}, "pool"),
        ({"retries": -1}, "retries"),
        ({"sweep": "has space"}, "sweep"),
        ({"timeouts": {"reset": 0}}, "timeouts.reset"),
        ("not-a-mapping-but-a-missing-file.yaml", "config"),
    ],
)
def test_a_bad_sandbox_config_names_its_field(config: object, field: str) -> None:
    with pytest.raises((BadInput, NotFound)) as raised:
        load_config(config) if isinstance(config, str) else parse_config(config)
    assert field in str(raised.value), str(raised.value)


def test_task_init_refuses_a_pool_without_a_bed_the_farm_would_use(tmp_path: Path) -> None:
    """One clear error before any sample: no bed, or only one that is quarantined or not escrowed."""
    import anyio

    from apg_farm.inspect.sandbox import ApgSandboxEnvironment
    from apg_farm.store import Store
    from tests.support.rows import add_bed

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    config = parse_config({"database_url": url, "fixtures": ["kb_docs", "canvas_home"]})
    with pytest.raises(BadInput, match=r"no bed of pool .* can take a sample") as raised:
        anyio.run(ApgSandboxEnvironment.task_init, "t", config)
    assert raised.value.field == "fixtures" and "the pool has no bed" in str(raised.value)
    store = Store(url)
    bed = add_bed(store, "b1")
    with store.session() as session:
        from apg_farm.store import Bed

        session.get_one(Bed, bed).state = "quarantined"
    with pytest.raises(BadInput, match=r"b1: quarantined"):
        anyio.run(ApgSandboxEnvironment.task_init, "t", config)
    with store.session() as session:
        row = session.get_one(Bed, bed)
        row.state, row.web_container = "active", False
    # A host-only bed has no container for the sample's commands: said so.
    with pytest.raises(BadInput, match=r"b1: host-only"):
        anyio.run(ApgSandboxEnvironment.task_init, "t", config)
    # A bed the config names that is not in the pool, or not enrolled at all: named.
    add_bed(store, "elsewhere", "other_pool")
    named = parse_config({**config.model_dump(), "beds": ["b1", "nope", "elsewhere"]})
    with pytest.raises(BadInput) as raised:
        anyio.run(ApgSandboxEnvironment.task_init, "t", named)
    said = str(raised.value)
    assert raised.value.field == "beds" and "nope: not enrolled" in said, said
    assert "elsewhere: in pool other_pool" in said and "b1: host-only" in said, said
    with store.session() as session:
        session.get_one(Bed, bed).web_container = True
    anyio.run(ApgSandboxEnvironment.task_init, "t", config)
    store.dispose()


def test_a_bad_database_url_of_the_sandbox_config_is_named_as_such(tmp_path: Path) -> None:
    """#32: the URL came from the sandbox's YAML, so the error names that key, not the farm's
    APG_FARM_DATABASE_URL the user never set."""
    import anyio

    from apg_farm.inspect.sandbox import ApgSandboxEnvironment

    config = parse_config({"database_url": "mysql://farm@db/farm"})
    with pytest.raises(BadInput) as raised:
        anyio.run(ApgSandboxEnvironment.task_init, "t", config)
    said = str(raised.value)
    assert raised.value.field == "database_url of the apg sandbox config", said
    assert "APG_FARM_DATABASE_URL" not in said and "SQLite or PostgreSQL" in said, said
