"""One installed package (#19): the wheel holds `apg_farm` alone, so installing apg-farm next to
PyPI's `fixtures` (or `scheduler`) breaks neither, and the demo runs from the wheel, its simulated
bed shipped as package data. Only the demos import the simulated bed, and only when they run."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from apg_farm.fixtures import simbed

ROOT = Path(__file__).resolve().parents[2]
#: The modules that may import the simulated bed, each only inside a function.
DEMOS = {
    "apg_farm/cli/demo.py",
    "apg_farm/cli/attacks.py",
    "apg_farm/cli/games.py",
    "apg_farm/cli/proc_peek.py",
}


def _simbed_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, at module level) of each import of the simulated bed in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        if any(n == "apg_farm.fixtures" or n.startswith("apg_farm.fixtures.") for n in names):
            found.append((node.lineno, id(node) in top))
    return found


def test_only_the_demos_import_the_simulated_bed_and_only_when_they_run() -> None:
    offenders = []
    for top in ("apg_farm", "workers", "scheduler"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            for line, module_level in _simbed_imports(path):
                if relative not in DEMOS or module_level:
                    offenders.append(f"{relative}:{line}")
    assert offenders == []


def test_the_attack_demo_names_the_simulated_beds_first_model() -> None:
    from apg_farm.cli.attacks import MODEL

    assert simbed.DEFAULT_MODELS[0] == MODEL


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_apg_farm_alone_beside_pypis_fixtures(tmp_path: Path) -> None:
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("apg_farm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["apg_farm"]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "apg_farm"
    }
    assert "apg_farm/fixtures/simbed/droost_build_tasks.json" in names
    assert "apg_farm/workers/engine.py" in names and "apg_farm/scheduler/plan.py" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    # PyPI's `fixtures` first, then apg-farm beside it.
    _run([python, "-m", "pip", "install", "-q", "fixtures"], cwd=tmp_path)
    _run([python, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)
    home = tmp_path / "home"
    demo = subprocess.run(
        [str(venv / "bin" / "apg-farm"), "demo", "--beds", "2", "--trials", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "APG_FARM_HOME": str(home)},
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    # PyPI's package is still the one `import fixtures` gives, whole.
    probe = _run(
        [python, "-c", "import fixtures; print(fixtures.__file__); print(fixtures.Fixture)"],
        cwd=tmp_path,
    )
    assert "site-packages/fixtures/__init__.py" in probe.stdout
    assert "Fixture" in probe.stdout
