"""The attack catalogue: every attack ends as docs/attacks.md says, played on simulated beds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from apg_farm.cli.attacks import CATALOGUE, Attack, attacks_table, run_attack
from apg_farm.store import Store
from tests.test_cli import farm

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "attacks.md"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


@pytest.mark.parametrize("attack", CATALOGUE, ids=[a.key for a in CATALOGUE])
def test_every_attack_ends_as_catalogued(
    attack: Attack, sqlite_store: Store, tmp_path: Path
) -> None:
    """The hostile agent's move on a bed of its own: the outcome, the executions and the bed's
    state are the catalogue's."""
    recorded = run_attack(sqlite_store, tmp_path, attack)
    assert recorded.outcome == attack.outcome, recorded
    assert recorded.as_catalogued, recorded


def _page_rows() -> dict[str, tuple[str, str]]:
    """attack key -> (outcome, bed) from the catalogue table of docs/attacks.md."""
    rows = re.findall(
        r"^\| `([a-z_]+)` \|[^|]*\|[^|]*\| (\w+) \| (quarantined|active) \|", PAGE.read_text(), re.M
    )
    return {key: (outcome, bed) for key, outcome, bed in rows}


def test_the_page_is_the_catalogue() -> None:
    """docs/attacks.md has one row per attack with the same outcome and bed state."""
    expected = {
        a.key: (str(a.outcome), "quarantined" if a.quarantine else "active") for a in CATALOGUE
    }
    assert _page_rows() == expected


def test_every_test_the_page_names_exists() -> None:
    """Each `tests/…::name` the page cites is a test function in that file."""
    cited = re.findall(r"`(tests/[a-z_]+\.py)::([a-z_0-9]+)", PAGE.read_text())
    assert cited
    for path, name in cited:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"


def test_the_table_says_when_an_attack_was_not_caught(sqlite_store: Store, tmp_path: Path) -> None:
    """A catalogue entry whose expectation does not hold is printed as `no`: the check can fail."""
    from dataclasses import replace

    from rich.console import Console

    from apg_farm.contract import Outcome

    wrong = replace(CATALOGUE[0], outcome=Outcome.PASSED)
    recorded = run_attack(sqlite_store, tmp_path, wrong)
    assert not recorded.as_catalogued
    console = Console(width=200, record=True)
    console.print(attacks_table([recorded]))
    assert "no (expected PASSED)" in console.export_text()


@pytest.mark.slow
def test_demo_attacks_plays_the_whole_catalogue(tmp_path: Path) -> None:
    """`apg-farm demo --attacks` exits 0 and prints every attack as caught."""
    done = farm(tmp_path / "home", "demo", "--attacks")
    for attack in CATALOGUE:
        assert re.search(rf"│ {attack.key} +│.*│ yes", done.stdout), attack.key
