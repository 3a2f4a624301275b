"""The attack catalogue: every attack ends as docs/attacks.md says, played on simulated beds."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.cli.attacks import CATALOGUE, MODEL, Attack, attacks_table, run_attack
from apg_farm.cli.games import GAMES, Played, Rates, games_table
from apg_farm.store import Execution, Store
from tests.cli.test_cli import farm

ROOT = Path(__file__).resolve().parents[2]
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


def test_a_decoy_naming_another_model_is_not_graded(sqlite_store: Store, tmp_path: Path) -> None:
    """Among the run folders naming the task, the graded run is the one naming the attempt's
    model, not the decoy the agent printed last."""
    [decoy] = [a for a in CATALOGUE if a.key == "decoy_run"]
    run_attack(sqlite_store, tmp_path, decoy)
    with sqlite_store.session() as session:
        run_id, folder = session.execute(select(Execution.run_id, Execution.evidence_dir)).one()
    assert run_id is not None and folder is not None
    # Both run folders were moved off the bed when the execution ended (workers/evidence.py).
    runs = Path(folder) / "runs"
    record = json.loads((runs / run_id / "run.json").read_text())
    assert record["model"] == MODEL
    assert len(list(runs.iterdir())) == 2  # the decoy is there, and was not taken


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


def test_the_page_names_every_game() -> None:
    """docs/attacks.md has one `game` row per game `demo --attacks` plays, and no other."""
    keys = re.findall(r"^\| `game` `([a-z_]+)`", PAGE.read_text(), re.M)
    assert sorted(keys) == sorted(g.key for g in GAMES)


def _rates(first_try: float, headline: float, counted: int = 12, outside: int = 0) -> Rates:
    return Rates(12, counted, headline, headline, first_try, outside, 0)


@pytest.mark.parametrize(
    ("gamer", "honest", "lost", "paused", "wrong"),
    [
        pytest.param(_rates(0.3, 0.35), _rates(0.3, 0.3), [], [], [], id="as-catalogued"),
        pytest.param(_rates(0.3, 0.36), _rates(0.3, 0.3), [], [], ["headline"], id="inflated"),
        pytest.param(_rates(0.3, 0.3, outside=1), _rates(0.3, 0.3), [], [], ["out of"], id="out"),
        pytest.param(_rates(0.3, 0.3, 11), _rates(0.3, 0.3), [], [], ["not counted"], id="short"),
        pytest.param(_rates(0.3, 0.3), _rates(0.3, 0.3, 11), [], [], ["honest"], id="honest"),
        pytest.param(_rates(0.3, 0.3), _rates(0.3, 0.3), ["b1: x"], [], ["beds lost"], id="bed"),
        pytest.param(_rates(0.3, 0.3), _rates(0.3, 0.3), [], ["why"], ["paused"], id="paused"),
    ],
)
def test_a_game_is_as_catalogued_only_when_every_rule_holds(
    gamer: Rates, honest: Rates, lost: list[str], paused: list[str], wrong: list[str]
) -> None:
    """The game's verdict can fail, one rule at a time (the games themselves are played by
    `test_demo_attacks_plays_the_whole_catalogue`)."""
    from rich.console import Console

    game = next(g for g in GAMES if g.key == "provider_revert")
    played = Played(game, gamer, [honest], lost, paused)
    found = played.wrong()
    assert len(found) == len(wrong) and all(w in f for w, f in zip(wrong, found, strict=True))
    console = Console(width=300, record=True)
    console.print(games_table([played]))
    assert ("│ yes" in console.export_text()) == (not wrong)


def test_every_test_the_page_names_exists() -> None:
    """Each `tests/…::name` the page cites is a test function in that file."""
    cited = re.findall(r"`(tests/[a-z_/]+\.py)::([a-z_0-9]+)", PAGE.read_text())
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
@pytest.mark.timeout(1200)  # 24 attacks, then 3 games of 36-54 attempts on 4 beds each
def test_demo_attacks_plays_the_whole_catalogue(tmp_path: Path) -> None:
    """`apg-farm demo --attacks` exits 0 and prints every attack as caught."""
    done = farm(tmp_path / "home", "demo", "--attacks", timeout=1150)
    for attack in CATALOGUE:
        assert re.search(rf"│ {attack.key} +│.*│ yes", done.stdout), attack.key
    for game in GAMES:
        assert re.search(rf"│ {game.key} +│.*│ yes", done.stdout), game.key
