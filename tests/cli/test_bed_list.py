"""`apg-farm bed list` at scale, as a real process: problems first and grouped by host, `--sort`,
`--state`, `--host`, `--all`; and what a bed or an operator wrote (Rich markup, escape sequences)
printed as plain text by `bed list` and `sweep status`, never read as markup nor sent to the
terminal (apg_farm/cli/bed_list.py, apg_farm/printable.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apg_farm.printable import printable
from apg_farm.store import Store
from tests.support.cli_runner import run_process, store_env
from tests.support.many_beds import HOSTILE_REASON, ManyBeds, make_many_beds

#: What must never reach a terminal from a bed: ESC, BEL, 8-bit CSI and ST.
RAW = ("\x1b", "\x07", "\x9b", "\x9c")


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], ManyBeds]:
    home = tmp_path_factory.mktemp("bed-list")
    url = f"sqlite:///{home / 'farm.db'}"
    made = make_many_beds(Store(url), hosts=10, per_host=20)
    return store_env(home, url), made


def listed(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(run_process(env, "bed", "list", "--json", *args).stdout)
    return rows


def test_problems_first_grouped_by_host(farm: tuple[dict[str, str], ManyBeds]) -> None:
    env, made = farm
    rows = listed(env)
    assert len(rows) == 200
    # The worst beds lead; each host's beds stay together, its problems first.
    assert rows[0]["problem"] == "quarantined" and rows[0]["name"] in made.quarantined
    hosts = [r["host"] for r in rows]
    assert hosts == sorted(hosts, key=hosts.index), "a host's beds are not together"
    for host in set(hosts):
        ranks = [r["problem"] or "" for r in rows if r["host"] == host]
        assert ranks.index("") >= len([p for p in ranks if p]), (host, ranks)
    stuck = next(r for r in rows if r["name"] == made.stuck[0])
    assert stuck["problem"] == "stuck" and stuck["lease_expired_seconds"] > 1000
    assert {r["name"] for r in rows if r["problem"] == "failing"} == set(made.failing)


def test_sort_and_filters(farm: tuple[dict[str, str], ManyBeds]) -> None:
    env, made = farm
    names = [r["name"] for r in listed(env, "--sort", "name")]
    assert names == sorted(names) and len(names) == 200
    by_failures = listed(env, "--sort", "failures")
    assert by_failures[0]["failures_in_a_row"] == 3
    assert [r["host"] for r in listed(env, "--sort", "host")][:20] == ["host00.farm"] * 20
    assert {r["name"] for r in listed(env, "--state", "quarantined")} == set(made.quarantined)
    assert {r["name"] for r in listed(env, "--state", "stuck")} == set(made.stuck)
    both = listed(env, "--state", "stuck", "--state", "removed")
    assert {r["name"] for r in both} == set(made.stuck + made.removed)
    on_host = listed(env, "--host", "host03.farm")
    assert {r["name"] for r in on_host} == set(made.by_host["host03.farm"])
    assert listed(env, "--host", "host03.farm", "--state", "quarantined") == []


@pytest.mark.parametrize(
    ("args", "field"),
    [(("--sort", "colour"), "--sort"), (("--state", "sleepy"), "--state")],
)
def test_a_wrong_sort_or_state_is_one_line(
    farm: tuple[dict[str, str], ManyBeds], args: tuple[str, ...], field: str
) -> None:
    env, _ = farm
    done = run_process(env, "bed", "list", *args, code=2)
    assert field in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr


def test_the_table_hides_removed_beds_and_counts_hosts(
    farm: tuple[dict[str, str], ManyBeds],
) -> None:
    env, made = farm
    done = run_process(env, "bed", "list")
    assert made.removed[0] not in done.stdout
    assert f"{len(made.removed)} removed beds not shown (--all shows them)" in done.stderr
    assert "host03.farm: 19 (18 active, 1 failing)" in " ".join(done.stdout.split())
    # The first bed row is a quarantined one.
    first = next(line for line in done.stdout.splitlines() if "rack" in line)
    assert "quarantined" in first
    everything = run_process(env, "bed", "list", "--all")
    assert made.removed[0] in everything.stdout and "not shown" not in everything.stderr


def test_markup_and_escapes_from_a_bed_are_text(farm: tuple[dict[str, str], ManyBeds]) -> None:
    env, made = farm
    # Wide enough for the table itself (its columns are parsed below), whatever COLUMNS says.
    table = run_process(
        {**env, "COLUMNS": "200"}, "bed", "list", "--host", "host00.farm", "--state", "quarantined"
    ).stdout
    for raw in RAW:
        assert raw not in table
    # Stacked on a narrow terminal, the reason is the same text.
    stacked = run_process(
        {**env, "COLUMNS": "60"}, "bed", "list", "--host", "host00.farm", "--state", "quarantined"
    ).stdout
    assert "│" not in stacked and "[/] [bold red]boom[/bold red]" in stacked, stacked
    assert not any(raw in stacked for raw in RAW) and "pwned-title" not in stacked
    # The reason column (the 6th), its wrapped lines joined: markup printed as written (Rich
    # would have eaten it, or crashed on `[/]`).
    reason = "".join(
        line.split("│")[6].strip() for line in table.splitlines() if line.count("│") > 6
    )
    assert "".join(reason.split()) == "resetfailed[/][boldred]boom[/boldred]linkredend", reason
    # The window title and the hyperlink's target were escape sequences: gone whole.
    assert "pwned-title" not in table and "evil.example" not in table
    # JSON is data: the reason as stored, escaped by JSON, for a program to read.
    [row] = [r for r in listed(env, "--state", "quarantined") if r["name"] == made.quarantined[0]]
    assert row["reason"] == HOSTILE_REASON

    status = run_process(env, "sweep", "status", "busy")
    for raw in RAW:
        assert raw not in status.stdout and raw not in status.stderr
    assert "[/]" in status.stdout and "boom[/bold" in status.stdout, status.stdout
    assert "pwned-title" not in status.stdout


def test_printable_strips_every_control() -> None:
    assert printable(HOSTILE_REASON) == ("reset failed [/] [bold red]boom[/bold red] link red  end")
    assert printable("a\x1b[31mb\x1b[0mc\r\n\td\x00\x7f\x85e") == "abc\n\tde"
    assert printable("\x1b]0;title\x07x\x9d8;;u\x9cy\x1bPdcs\x1b\\z") == "xyz"
    assert printable("cut \x1b]0;unterminated") == "cut "
    assert printable(None) == ""
    for raw in RAW:
        assert raw not in printable(HOSTILE_REASON)


def test_the_triage_reads_on_both_backends(store: Store) -> None:
    """Stuck beds (an expired lease) and the beds page's order, on SQLite and PostgreSQL."""
    from apg_farm.beds import stuck_beds
    from apg_farm.dashboard import beds_overview

    made = make_many_beds(store, hosts=4, per_host=6)
    stuck = stuck_beds(store)
    assert set(stuck) == set(made.stuck) and all(s > 1000 for s in stuck.values())
    overview = beds_overview(store)
    attention = overview["attention"]
    # Quarantined first, then stuck, then failing; nothing else.
    assert attention[: len(made.quarantined)] == sorted(made.quarantined)
    assert attention[len(made.quarantined) : len(made.quarantined) + len(made.stuck)] == sorted(
        made.stuck
    )
    assert set(attention) == set(made.quarantined + made.stuck + made.failing)
    first = overview["hosts"][0]
    assert first["problems"]["quarantined"] == 1 and first["beds"][0]["problem"] == "quarantined"
    assert sum(g["states"].get("removed", 0) for g in overview["hosts"]) == len(made.removed)
