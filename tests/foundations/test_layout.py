"""The layout: wings import each other only through their `__init__`, and only downwards.

A wing is a package named for one concept (`apg_farm/contract/`, `apg_farm/beds/`, ...). Its
modules are private to it; other code imports the names its `__init__` exports. Tests are the one
exception: a unit test reaches into the module it tests.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Wings in import order: a wing may import those of a lower rank, never its own rank or higher.
WINGS: dict[str, int] = {
    "apg_farm.transports": 0,
    "apg_farm.contract": 1,
    "apg_farm.store": 2,
    "apg_farm.beds": 3,
    "apg_farm.results": 3,
    "apg_farm.scheduler": 4,
    "apg_farm.workers": 5,
    # The web dashboard (`apg-farm serve`): below the CLI, which alone imports it.
    "apg_farm.dashboard": 6,
    # The Inspect AI sandbox and its scorer (an optional extra): nothing of the farm imports it.
    "apg_farm.inspect": 6,
    "apg_farm.cli": 7,
}
#: Modules every wing may import; they import nothing of the farm but each other.
FOUNDATIONS = {
    "apg_farm",
    "apg_farm.defaults",
    "apg_farm.errors",
    "apg_farm.settings",
    "apg_farm.specs",
    "apg_farm.strict_yaml",
    "apg_farm.sequential",
    "apg_farm.printable",
    "apg_farm.secret_env",
    "apg_farm.lazy_exports",
}
#: Code checked strictly (tests/ may import a module it tests directly).
CHECKED = ("apg_farm", "scheduler", "workers", "bench", "fixtures")
#: The one top-level package this project installs: imports of anything else are third-party.
OURS = ("apg_farm",)
#: Folders at the repository's top that are apg_farm's subpackages (apg_farm/<name> links to them).
LINKED = ("workers", "scheduler", "fixtures")


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    importer: str
    target: str


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] in LINKED:
        parts.insert(0, "apg_farm")
    return ".".join(parts)


def _wing(module: str) -> str | None:
    for wing in sorted(WINGS, key=len, reverse=True):
        if module == wing or module.startswith(wing + "."):
            return wing
    return None


def _is_submodule(package: str, name: str) -> bool:
    folder = ROOT.joinpath(*package.split("."))
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()


def _imports(top: str) -> list[Import]:
    found = []
    for path in sorted((ROOT / top).rglob("*.py")):
        importer = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [Import(path, node.lineno, importer, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    # `from pkg import mod` imports the module pkg.mod unless pkg defines the name.
                    sub = f"{node.module}.{alias.name}"
                    target = sub if _is_submodule(node.module, alias.name) else node.module
                    found.append(Import(path, node.lineno, importer, target))
    return [i for i in found if i.target.split(".")[0] in OURS]


def _plant(root: Path, files: dict[str, str]) -> None:
    """A scratch tree for a check to read: each file (its folders made) with its text."""
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)


def _where(imp: Import) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line}"


def private_imports(tops: tuple[str, ...] = CHECKED) -> list[str]:
    """Imports of a wing's module from outside the wing, each named with the fix."""
    offenders = []
    for top in tops:
        for imp in _imports(top):
            wing = _wing(imp.target)
            if wing and imp.target != wing and _wing(imp.importer) != wing:
                offenders.append(
                    f"{_where(imp)}: {imp.importer} imports {imp.target}, private to the "
                    f"{wing} wing: import the name from {wing} (export it from its __init__)"
                )
    return offenders


def upward_imports(tops: tuple[str, ...] = CHECKED) -> list[str]:
    """Imports against the wings' order, and foundations or fixtures that reach into the farm."""
    offenders = []
    for top in tops:
        for imp in _imports(top):
            source, target = _wing(imp.importer), _wing(imp.target)
            if imp.importer in FOUNDATIONS or imp.importer.startswith("apg_farm.fixtures"):
                simbed = imp.target.startswith("apg_farm.fixtures")
                if target or not (imp.target in FOUNDATIONS or simbed):
                    offenders.append(f"{_where(imp)}: {imp.importer} must not import {imp.target}")
            elif source and target and source != target and WINGS[target] >= WINGS[source]:
                offenders.append(
                    f"{_where(imp)}: {source} (rank {WINGS[source]}) imports {target} "
                    f"(rank {WINGS[target]}): imports flow downwards only"
                )
    return offenders


def test_no_module_outside_a_wing_imports_its_private_modules() -> None:
    """Every import of a wing's module from outside it goes through the wing's __init__."""
    assert private_imports() == []


def test_imports_flow_one_way() -> None:
    """cli → dashboard → workers → scheduler → results/beds → store → contract → transports; foundations
    and the simulated bed import nothing of the wings."""
    assert upward_imports() == []


def test_the_checks_name_an_offender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A private import and an upward import planted in a scratch tree are both reported."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    for package in ("apg_farm", "apg_farm/store", "apg_farm/beds", "apg_farm/contract"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "apg_farm/beds/registry.py").write_text("")
    (tmp_path / "apg_farm/store/db.py").write_text("from apg_farm.beds import registry\n")
    (tmp_path / "apg_farm/contract/commands.py").write_text("from apg_farm.store.db import x\n")
    private = private_imports(("apg_farm",))
    assert len(private) == 2
    assert any(
        "apg_farm/store/db.py:1" in p
        and "apg_farm.beds.registry, private to the apg_farm.beds" in p
        for p in private
    )
    upward = upward_imports(("apg_farm",))
    assert any("apg_farm/contract/commands.py:1: apg_farm.contract (rank 1)" in u for u in upward)
    assert any("apg_farm.store (rank 2) imports apg_farm.beds (rank 3)" in u for u in upward)


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_each_wing_says_what_lives_there_and_exports_it(wing: str) -> None:
    """A docstring of a few lines, and an `__all__` whose every name resolves."""
    package = importlib.import_module(wing)
    assert package.__doc__ and len(package.__doc__.strip().splitlines()) >= 1
    exported = getattr(package, "__all__", None)
    assert exported, f"{wing}/__init__.py has no __all__"
    for name in exported:
        assert getattr(package, name) is not None, f"{wing} exports {name}, which does not resolve"


def test_no_module_is_left_at_an_old_place() -> None:
    """apg_farm/ holds the foundations and the wings, nothing else (no compatibility shims)."""
    loose = {p.stem for p in (ROOT / "apg_farm").glob("*.py")} - {"__init__", "__main__"}
    assert {f"apg_farm.{name}" for name in loose} == FOUNDATIONS - {"apg_farm"}


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md names each module by its path, so the map stays true."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for top in ("apg_farm", "scheduler", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if path.name == "__init__.py" or "migrations" in relative.parts:
                continue
            if str(relative) not in page:
                missing.append(str(relative))
    assert missing == []


#: The modules that may change attempt, execution and bed-state rows (docs/architecture.md,
#: "The lifecycle"); migrations move data too.
LIFECYCLE = {
    "apg_farm/store/lifecycle.py",
    "apg_farm/store/claims.py",
    "apg_farm/store/rules.py",
    "apg_farm/store/models.py",
}
#: Tables whose rows only the lifecycle changes.
LIFECYCLE_TABLES = {"Attempt", "Execution", "Bed"}
#: Columns of those rows that carry the lifecycle (an assignment to one outside is an offence).
LIFECYCLE_COLUMNS = {
    "state",
    "state_reason",
    "outcome",
    "result",
    "lease_expires_at",
    "bed_id",
    "consecutive_errors",
    "infra_failures",
    "excluded_beds",
    "not_before",
    "provider_failures",
    "deliveries",
    "dispatches",
    "enqueued_at",
    "agent_started",
}


def lifecycle_writes(tops: tuple[str, ...] = ("apg_farm", "workers", "scheduler")) -> list[str]:
    """Code outside the lifecycle that writes its rows: `update(`, `insert(` or `delete(` on
    Attempt, Execution or Bed, or an assignment to one of their lifecycle columns (on anything
    but `self`), each named with where it is."""
    offenders = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative in LIFECYCLE or "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("update", "insert", "delete")
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in LIFECYCLE_TABLES
                ):
                    offenders.append(f"{relative}:{node.lineno}: {node.func.id}({node.args[0].id})")
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = [
                        t
                        for target in node.targets
                        for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                    ]
                elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                    targets = [node.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr in LIFECYCLE_COLUMNS
                        and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                    ):
                        offenders.append(f"{relative}:{node.lineno}: sets .{target.attr}")
    return offenders


def test_only_the_lifecycle_changes_attempts_executions_and_bed_states() -> None:
    """Every state change goes through apg_farm/store/lifecycle.py (with claims.py and rules.py):
    its preconditions and lock order hold whoever asks."""
    assert lifecycle_writes() == []


def test_the_lifecycle_check_names_an_offender(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    _plant(
        tmp_path,
        {
            "apg_farm/beds/inventory.py": "def drop(session, bed, attempt):\n"
            "    bed.state = 'removed'\n"
            "    attempt.outcome, attempt.reason = 'ERROR', 'x'\n"
            "    session.execute(update(Execution).values(result='LOST'))\n",
            "apg_farm/store/lifecycle.py": "def f(bed):\n    bed.state = 'ok'\n",
        },
    )
    assert lifecycle_writes(("apg_farm",)) == [
        "apg_farm/beds/inventory.py:2: sets .state",
        "apg_farm/beds/inventory.py:3: sets .outcome",
        "apg_farm/beds/inventory.py:4: update(Execution)",
    ]


#: The module where every retry decision is made, and the one value holding its numbers.
RETRY_POLICY = "apg_farm/contract/retries.py"
#: Names the policy's numbers went by before they were gathered there (issue #33).
RETRY_ALIASES = {"AGENT_START_SECONDS": "start_window"}
#: Numbers under a policy name that are no policy default, each with why: handed in as overrides.
RETRY_OVERRIDES = {
    # The attack demo's time-scaled beds need a shorter start window (cli/attacks.py).
    ("apg_farm/cli/attacks.py", "START_WINDOW"),
}


def _policy_names() -> dict[str, str]:
    """Each name a policy number may be defined under (the field, upper or lower case, or an old
    alias), mapped to its field of RetryPolicy."""
    from dataclasses import fields

    from apg_farm.contract import RetryPolicy

    names = {f.name: f.name for f in fields(RetryPolicy)}
    names |= {f.name.upper(): f.name for f in fields(RetryPolicy)}
    return names | RETRY_ALIASES


def _number(node: ast.expr | None) -> bool:
    """A numeric literal, or Field(default=<numeric literal>)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.Call):
        given = [k.value for k in node.keywords if k.arg == "default"] + node.args[:1]
        return any(_number(value) for value in given)
    return False


def retry_constants(tops: tuple[str, ...] = CHECKED) -> list[str]:
    """Numbers of the retry policy defined outside contract/retries.py: a module or class
    constant, a field default or a parameter default under one of its names."""
    names = _policy_names()
    offenders: list[tuple[str, int, str]] = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if relative == RETRY_POLICY:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                found: list[tuple[str, ast.expr | None]] = []
                if isinstance(node, ast.Assign):
                    found = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found = [(node.target.id, node.value)]
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    arguments = node.args
                    positional = [*arguments.posonlyargs, *arguments.args]
                    found = [
                        (a.arg, d)
                        for a, d in zip(
                            positional[len(positional) - len(arguments.defaults) :],
                            arguments.defaults,
                            strict=True,
                        )
                    ]
                    found += [
                        (a.arg, d)
                        for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
                    ]
                for name, value in found:
                    if name in names and _number(value) and (relative, name) not in RETRY_OVERRIDES:
                        line = value.lineno if value else node.lineno
                        offenders.append(
                            (
                                relative,
                                line,
                                f"{relative}:{line}: {name} is RetryPolicy.{names[name]}: define "
                                f"it only in {RETRY_POLICY} and hand the policy in",
                            )
                        )
    return [message for _, _, message in sorted(offenders)]


def test_the_retry_policys_numbers_are_defined_only_in_its_module() -> None:
    """Leases, back-offs, retries, hand-backs, deliveries and failures in a row are fields of
    RetryPolicy (contract/retries.py), nowhere else: no second default to drift from it."""
    assert retry_constants() == []


def test_the_retry_check_names_an_offender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    _plant(
        tmp_path,
        {
            "apg_farm/workers/tasks.py": "HAND_BACK_DELAY = 1.0\n"
            "class S:\n"
            "    lease_seconds: float = Field(default=60.0, gt=0)\n"
            "def run(*, provider_retries: int = 3, other: int = 3) -> None: ...\n"
            "AGENT_START_SECONDS = 60.0\n"
            "HAND_BACK_LIMIT = POLICY.hand_back_limit\n",
            "apg_farm/contract/retries.py": "HAND_BACK_LIMIT = 10\n",
        },
    )
    found = retry_constants(("apg_farm",))
    assert [f.split(" is ")[0] for f in found] == [
        "apg_farm/workers/tasks.py:1: HAND_BACK_DELAY",
        "apg_farm/workers/tasks.py:3: lease_seconds",
        "apg_farm/workers/tasks.py:4: provider_retries",
        "apg_farm/workers/tasks.py:5: AGENT_START_SECONDS",
    ]
    assert "RetryPolicy.hand_back_delay: define it only in apg_farm/contract/retries.py" in found[0]
