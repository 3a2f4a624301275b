"""The sweep file refuses what YAML and a lax model would let through: booleans for numbers, keys
given twice, nesting no sweep needs, sizes nobody means; and it parses in linear time."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlalchemy import select as sql_select

from apg_farm.defaults import CONFIRM_ATTEMPTS, MAX_ATTEMPTS, SWEEP_FILE_LIMIT
from apg_farm.errors import BadInput
from apg_farm.specs import SweepSpec, check_size, is_large, load_sweep, parse_sweep
from apg_farm.store import Attempt, Store
from apg_farm.strict_yaml import MAX_DEPTH, load_yaml
from tests.support.cli_runner import run_process, store_env

GOOD = {"name": "s1", "tasks": ["t1"], "models": ["m1"], "trials": 2}
LOADERS = pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "pure"])


def _yaml(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    file = tmp_path / name
    file.write_text(text)
    return file


def _tasks_file(tmp_path: Path, count: int, *, models: int = 1, trials: int = 1) -> Path:
    names = ", ".join(f"m{i}" for i in range(models))
    lines = "".join(f"  - task_{i:07d}\n" for i in range(count))
    return _yaml(
        tmp_path, f"name: big\nmodels: [{names}]\ntrials: {trials}\ntasks:\n{lines}", "big.yaml"
    )


def _env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A process environment whose store is a SQLite file not yet made: a refusal leaves none."""
    db = tmp_path / "farm.db"
    return store_env(tmp_path / "home", f"sqlite:///{db}"), db


# --- 1. Strict numbers and switches -------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"trials": True}, "trials", "true is a YAML boolean, not a whole number"),
        ({"trials": "3"}, "trials", "quoted text, not a whole number; write a whole number"),
        ({"trials": 2.5}, "trials", "e.g. trials: 10"),
        ({"retries": False}, "retries", "e.g. retries: 2"),
        ({"timeouts": {"run": True}}, "timeouts.run", "not a number; write a number"),
        ({"budget_usd": True}, "budget_usd", "e.g. budget_usd: 50"),
        ({"max_concurrent": {"m1": True}}, "max_concurrent.m1", "not a whole number"),
        ({"diff": 1}, "diff", "not true or false"),
        ({"stop": {"compare": ["m1", "m2"], "min_pairs": True}}, "stop.min_pairs", "boolean"),
        ({"stop": {"compare": ["m1", "m2"], "alpha": True}}, "stop.alpha", "e.g. alpha: 0.05"),
        ({"tasks": [True]}, "tasks.0", "quote it: 'true'"),
        ({"trials": None}, "trials", "empty; give a whole number"),
    ],
)
def test_a_boolean_or_text_where_a_number_is_meant_is_refused(
    change: dict[str, object], field: str, fix: str
) -> None:
    """`trials: true` is not 1 trial: the field is named and the fix says what to write."""
    data = {**GOOD, "models": ["m1", "m2"], **change}
    with pytest.raises(BadInput) as info:
        parse_sweep(data, source="f.yaml")
    assert f"f.yaml: {field}: " in str(info.value)
    assert fix in str(info.value)


def test_numbers_of_either_kind_where_seconds_are_meant_still_load() -> None:
    """Strict floats take whole numbers, and a stored spec (JSON) validates again as it was."""
    spec = parse_sweep({**GOOD, "timeouts": {"run": 60}, "budget_usd": 5, "diff": False})
    assert spec.timeouts.run == 60 and spec.budget_usd == 5 and spec.diff is False
    assert SweepSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_a_long_list_of_problems_is_cut_to_a_readable_few() -> None:
    """A file of a thousand bad task ids names the first twenty and counts the rest."""
    with pytest.raises(BadInput) as info:
        parse_sweep({**GOOD, "tasks": list(range(1000))}, source="f.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 21
    assert lines[-1] == "f.yaml: and 980 more problems"


# --- 2. Keys given twice ----------------------------------------------------------------------


@LOADERS
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(fast: bool) -> None:
    """YAML keeps the last of two equal keys; the farm says which key and where."""
    text = "name: s1\ntasks: [t1]\nmodels: [m1]\ntrials: 2\nretries: 1\ntrials: 2000\n"
    with pytest.raises(BadInput) as info:
        load_yaml(text, source="f.yaml", fast=fast)
    assert "f.yaml: line 6, column 1: key 'trials' given twice (first at line 4)" in str(info.value)
    assert "keep one of the two" in str(info.value)


@LOADERS
def test_keys_given_twice_are_found_in_nested_and_flow_mappings(fast: bool) -> None:
    """A nested mapping, and two spellings of one key (1 and true are one key to Python)."""
    with pytest.raises(BadInput, match="line 3, column 3: key 'run' given twice"):
        load_yaml("timeouts:\n  run: 60\n  run: 90\n", source="f", fast=fast)
    with pytest.raises(BadInput, match="key 'true' is key '1' of line 1 again"):
        load_yaml("{1: a,\n true: b}", source="f", fast=fast)


@LOADERS
def test_a_merge_may_still_be_overridden(fast: bool) -> None:
    """`<<: *base` then a key of base is YAML's way to override, not a duplicate."""
    text = "base: &b {run: 60, grade: 30}\ntimeouts:\n  <<: *b\n  run: 90\n"
    assert load_yaml(text, source="f", fast=fast)["timeouts"] == {"run": 90, "grade": 30}


# --- 3. Linear time ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_200000_task_file_parses_and_its_duplicates_are_named(tmp_path: Path) -> None:
    """Counted, not searched: 200,000 tasks take about a second (docs/benchmarks.md); the
    quadratic check took minutes, past this test's timeout."""
    file = _tasks_file(tmp_path, 200_000)
    assert len(load_sweep(file).tasks) == 200_000
    with file.open("a") as handle:
        handle.write("  - task_0000007\n  - task_0199999\n")
    with pytest.raises(BadInput, match=r"tasks: listed twice: task_0000007, task_0199999$"):
        load_sweep(file)


def test_a_file_larger_than_any_sweep_is_refused_unread(tmp_path: Path) -> None:
    """Past SWEEP_FILE_LIMIT the file is refused before a byte of it is parsed."""
    file = _yaml(tmp_path, "name: s1\n" + "#" * SWEEP_FILE_LIMIT + "\n")
    with pytest.raises(BadInput, match="larger than 8 MiB") as info:
        load_sweep(file)
    assert "split it into several sweeps" in str(info.value)


# --- 4. Nesting -------------------------------------------------------------------------------


@LOADERS
@pytest.mark.parametrize("style", ["flow", "block"])
def test_a_file_nested_20000_deep_is_refused_not_a_recursion_error(fast: bool, style: str) -> None:
    """Both loaders stop at a bound (libyaml's 1000 levels, ours MAX_DEPTH) with a BadInput."""
    if style == "flow":
        text = "tasks: " + "[" * 20_000 + "]" * 20_000 + "\n"
    else:  # indentation grows with depth: 2,000 levels are 2 MB, past both bounds
        text = "tasks:\n" + "".join(" " * i + "-\n" for i in range(1, 2_000))
    with pytest.raises(BadInput, match=r"f: nested too deeply at line \d+, column \d+") as info:
        load_yaml(text, source="f", fast=fast)
    assert "remove the extra brackets" in str(info.value)


def test_the_pure_loader_takes_what_is_within_its_bound() -> None:
    """MAX_DEPTH levels load; one more is refused."""
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load_yaml(ok, source="f", fast=False) is not None
    with pytest.raises(BadInput, match="nested too deeply"):
        load_yaml("[" + ok + "]", source="f", fast=False)


# --- 5. Sizes ---------------------------------------------------------------------------------


def _sized(tasks: int, models: int, trials: int) -> SweepSpec:
    return parse_sweep(
        {
            "name": "s",
            "tasks": [f"t{i}" for i in range(tasks)],
            "models": [f"m{i}" for i in range(models)],
            "trials": trials,
        }
    )


def test_a_sweep_over_the_limit_is_refused_with_the_flag_that_raises_it() -> None:
    """Over MAX_ATTEMPTS: refused, naming --max-attempts with the number needed; raised: taken."""
    spec = _sized(20, 10, 10_000)
    with pytest.raises(BadInput) as info:
        check_size(spec, source="f.yaml")
    assert str(info.value) == (
        "f.yaml: 20 tasks × 10 models × 10,000 trials = 2,000,000 attempts, over the limit of "
        "1,000,000 (fix: lower trials, tasks or models, or pass --max-attempts 2000000 if you "
        "mean it)"
    )
    check_size(spec, source="f.yaml", max_attempts=2_000_000)
    check_size(_sized(10, 10, MAX_ATTEMPTS // 100), source="f.yaml")


def test_a_sweep_no_submit_can_carry_is_refused_whatever_the_flag() -> None:
    """100 tasks × 100 models × 100,000 trials = 10⁹: split it, no flag helps."""
    with pytest.raises(BadInput, match="split it into sweeps of at most 10,000,000 attempts"):
        check_size(_sized(100, 100, 100_000), source="f", max_attempts=10_000_000)


def test_large_means_more_than_the_confirm_threshold() -> None:
    """CONFIRM_ATTEMPTS attempts go without asking; one more asks."""
    assert not is_large(_sized(CONFIRM_ATTEMPTS // 4, 4, 1))
    assert is_large(_sized(CONFIRM_ATTEMPTS // 4 + 1, 4, 1))


# --- Through the real command -----------------------------------------------------------------


def test_cli_refuses_a_boolean_trials_and_writes_no_store(tmp_path: Path) -> None:
    """`sweep submit` with `trials: true`: exit 2, one line naming the field and the fix."""
    env, db = _env(tmp_path)
    file = _yaml(tmp_path, "name: s1\ntasks: [t1]\nmodels: [m1]\ntrials: true\n")
    done = run_process(env, "sweep", "submit", str(file), code=2)
    assert done.stderr.strip() == (
        f"error: {file}: trials: true is a YAML boolean, not a whole number; "
        "write a whole number, e.g. trials: 10"
    )
    assert not db.exists()


def test_cli_run_refuses_a_key_given_twice(tmp_path: Path) -> None:
    """`run` with `trials` twice: exit 2 naming the key and both lines; no store made."""
    env, db = _env(tmp_path)
    file = _yaml(tmp_path, "name: s1\ntrials: 2\ntasks: [t1]\nmodels: [m1]\ntrials: 3000\n")
    done = run_process(env, "run", str(file), code=2)
    assert "line 5, column 1: key 'trials' given twice (first at line 2)" in done.stderr
    assert not db.exists()


def test_cli_refuses_a_file_nested_20000_deep(tmp_path: Path) -> None:
    """The file that raised RecursionError: exit 2, no traceback (run_process checks)."""
    env, db = _env(tmp_path)
    deep = "[" * 20_000 + "]" * 20_000
    file = _yaml(tmp_path, f"name: s1\ntasks: {deep}\nmodels: [m1]\ntrials: 1\n")
    for args in (["sweep", "submit", "--dry-run"], ["sweep", "submit"], ["run"]):
        done = run_process(env, *args, str(file), code=2)
        assert "nested too deeply at line 2" in done.stderr
    assert not db.exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cli_dry_run_prices_a_200000_task_file_and_says_a_submit_asks(tmp_path: Path) -> None:
    """200,000 tasks: parsed and priced; the note says a submit needs --yes; nothing stored."""
    env, db = _env(tmp_path)
    file = _tasks_file(tmp_path, 200_000)
    done = run_process(env, "sweep", "submit", str(file), code=2)
    assert "200,000 attempts, more than 100,000: a sweep this large is submitted only" in (
        done.stderr
    )
    assert not db.exists()
    Store(env["APG_FARM_DATABASE_URL"]).dispose()  # a dry run prices against a store that exists
    done = run_process(env, "sweep", "submit", "--dry-run", str(file))
    assert "200000 attempts" in done.stdout, done.stdout[-2000:]
    assert "200,000 attempts, more than 100,000: a submit asks first (--yes)" in done.stderr


def test_cli_refuses_a_billion_attempts_on_submit_run_and_dry_run(tmp_path: Path) -> None:
    """100 × 100 × 100,000 = 10⁹ attempts: refused by every command, before any store."""
    env, db = _env(tmp_path)
    tasks = ", ".join(f"t{i}" for i in range(100))
    models = ", ".join(f"m{i}" for i in range(100))
    file = _yaml(tmp_path, f"name: s1\ntasks: [{tasks}]\nmodels: [{models}]\ntrials: 100000\n")
    for args in (["sweep", "submit"], ["sweep", "submit", "--dry-run"], ["run", "--yes"]):
        done = run_process(env, *args, "--max-attempts", "10000000", str(file), code=2)
        assert "= 1,000,000,000 attempts, over the limit of 10,000,000" in done.stderr
    done = run_process(env, "sweep", "submit", "--max-attempts", "10000001", str(file), code=2)
    assert "--max-attempts" in done.stderr
    assert not db.exists()


def test_cli_over_the_limit_names_max_attempts_and_a_dry_run_only_notes_it(
    tmp_path: Path,
) -> None:
    """2,000,000 attempts: submit and run refuse naming `--max-attempts 2000000`; dry run: a note."""
    env, db = _env(tmp_path)
    tasks = ", ".join(f"t{i}" for i in range(20))
    file = _yaml(tmp_path, f"name: s1\ntasks: [{tasks}]\nmodels: [m1, m2]\ntrials: 50000\n")
    for args in (["sweep", "submit"], ["run"]):
        done = run_process(env, *args, "--yes", str(file), code=2)
        assert "pass --max-attempts 2000000 if you mean it" in done.stderr
    assert not db.exists()
    Store(env["APG_FARM_DATABASE_URL"]).dispose()  # a dry run prices against a store that exists
    done = run_process(env, "sweep", "submit", "--dry-run", str(file))
    assert "over the limit of 1,000,000: a submit needs --max-attempts 2000000" in done.stderr


def _count(db: Path) -> int:
    store = Store(f"sqlite:///{db}")
    try:
        with store.read() as session:
            return int(session.scalar(sql_select(func.count()).select_from(Attempt)) or 0)
    finally:
        store.dispose()


@pytest.mark.slow
def test_cli_a_large_sweep_needs_yes_and_then_is_submitted(tmp_path: Path) -> None:
    """Over CONFIRM_ATTEMPTS: refused without --yes (exit 2 naming it), stored with it."""
    env, db = _env(tmp_path)
    file = _yaml(tmp_path, "name: s1\ntasks: [a, b]\nmodels: [m1]\ntrials: 50001\n")
    for args in (["sweep", "submit"], ["run"]):
        done = run_process(env, *args, str(file), code=2)
        assert "100,002 attempts, more than 100,000: a sweep this large is submitted only " in (
            done.stderr
        )
        assert "(fix: add --yes if you mean it" in done.stderr
    assert not db.exists()
    run_process(env, "sweep", "submit", "--yes", str(file))
    assert _count(db) == 100_002


def _on_a_terminal(env: dict[str, str], args: list[str], answer: bytes) -> tuple[int, str]:
    """`apg-farm ARGS` with a terminal for stdin: the answer is typed once the question shows."""
    main, child = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "apg_farm", *args],
        stdin=child,
        stdout=subprocess.PIPE,
        stderr=child,
        env=env,
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Submit them?" not in seen and time.monotonic() < deadline:
        if select.select([main], [], [], 1)[0]:
            seen += os.read(main, 4096)
    os.write(main, answer)
    code = proc.wait(timeout=120)
    while select.select([main], [], [], 0.2)[0]:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.stdout is not None
    proc.stdout.close()
    return code, seen.decode(errors="replace")


@pytest.mark.slow
def test_cli_on_a_terminal_asks_and_a_no_stores_nothing(tmp_path: Path) -> None:
    """Interactive: the question names the size; `n` refuses (exit 2), `y` submits."""
    env, db = _env(tmp_path)
    file = _yaml(tmp_path, "name: s1\ntasks: [a, b]\nmodels: [m1]\ntrials: 50001\n")
    code, screen = _on_a_terminal(env, ["sweep", "submit", str(file)], b"n\n")
    assert "= 100,002 attempts, more than 100,000. Submit them? [y/N]" in screen
    assert code == 2 and "not confirmed: nothing was submitted" in screen
    assert "Traceback" not in screen and not db.exists()
    code, screen = _on_a_terminal(env, ["sweep", "submit", str(file)], b"y\n")
    assert code == 0, screen
    assert _count(db) == 100_002
