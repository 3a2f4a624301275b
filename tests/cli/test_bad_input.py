"""Mistakes a user makes in the environment and on the command line (#23): each ends with one
typed line naming the fix (exit 2 for bad input, 1 for a failure), the store unchanged, and
nothing made by a command that only reads. Every test runs `apg-farm` as a process."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from apg_farm.scheduler import submit
from apg_farm.settings import TEST_PREFIXES, known_names
from apg_farm.store import Store, normalize_url
from apg_farm.workers import EmbeddedExecutor
from tests.conftest import PG_URL, _postgres_store
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import make_beds, spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A SQLite store holding one finished sweep `done` (id 1): (home, URL)."""
    home = tmp_path_factory.mktemp("bad-input")
    url = f"sqlite:///{home / 'farm.db'}"
    store = Store(url)
    make_beds(store, home / "sim", 1)
    submission = submit(store, spec("done", tasks=1, models=1, trials=1))
    result = EmbeddedExecutor(store, submission.sweep_id).run()
    assert not result.errors and not result.stranded, result
    store.dispose()
    yield home, url


def _contents(url: str) -> dict[str, int]:
    """Rows per table and the schema's revision: what a command must leave as it was."""
    engine = sa.create_engine(normalize_url(url))
    with engine.connect() as conn:
        tables = sa.inspect(conn).get_table_names()
        counts = {
            t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar_one() for t in tables
        }
    engine.dispose()
    return counts


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


# --- 1. a read command never creates a store ------------------------------------------------------

READS = [
    ("bed", "list"),
    ("sweep", "status", "1"),
    ("report", "1"),
    ("budget", "show"),
    ("sweep", "cancel", "1"),
    ("seal", "1"),
]


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a))
def test_a_read_command_on_a_missing_sqlite_store_creates_nothing(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    """A mistyped URL names a file that is not there: the command says so and makes neither
    the file nor its folder (it used to answer from a new, empty store)."""
    missing = tmp_path / "nonexistent" / "dir" / "farm.db"
    env = store_env(tmp_path / "home", f"sqlite:///{missing}")
    done = run_process(env, *args, code=2)
    assert f"no store at {missing}" in done.stderr
    assert "apg-farm db upgrade" in done.stderr and "APG_FARM_DATABASE_URL" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "nonexistent").exists()
    assert not (tmp_path / "home").exists()


def test_a_read_command_under_a_new_home_creates_nothing(tmp_path: Path) -> None:
    """The embedded store under APG_FARM_HOME is not made by looking at it either."""
    env = store_env(tmp_path / "home", "")
    del env["APG_FARM_DATABASE_URL"]
    done = run_process(env, "bed", "list", code=2)
    assert f"no store at {tmp_path / 'home' / 'farm.db'}" in done.stderr
    assert not (tmp_path / "home").exists()


def test_a_dry_run_needs_a_store_that_exists(tmp_path: Path) -> None:
    """`sweep submit --dry-run` stores nothing, so it does not make a store to price against."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(spec("priced").model_dump(mode="json")))
    env = store_env(tmp_path / "home", f"sqlite:///{tmp_path / 'store' / 'farm.db'}")
    done = run_process(env, "sweep", "submit", str(sweep), "--dry-run", code=2)
    assert "no store at" in done.stderr
    assert not (tmp_path / "store").exists()


def test_db_upgrade_creates_the_store_and_says_so(tmp_path: Path) -> None:
    """The commands that may make a store say when they did, and only then."""
    path = tmp_path / "new" / "farm.db"
    env = store_env(tmp_path / "home", f"sqlite:///{path}")
    made = run_process(env, "db", "upgrade")
    assert f"created a new store at sqlite:///{path}" in made.stderr
    assert path.is_file()
    again = run_process(env, "db", "upgrade")
    assert "created" not in again.stderr and "is up to date" in again.stdout
    listed = run_process(env, "bed", "list")
    assert "beds" in listed.stdout


def test_sweep_submit_creates_the_store_and_says_so(tmp_path: Path) -> None:
    """`sweep submit` is a way to start a farm: it makes the store, saying so."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(spec("first").model_dump(mode="json")))
    env = store_env(tmp_path / "home", f"sqlite:///{tmp_path / 'farm.db'}")
    done = run_process(env, "sweep", "submit", str(sweep))
    assert "created a new store at" in done.stderr
    assert _contents(f"sqlite:///{tmp_path / 'farm.db'}")["attempts"] == 8


@pytest.fixture
def empty_schema() -> Iterator[str]:
    """The URL of a PostgreSQL schema with no table in it, dropped afterwards."""
    if not PG_URL:
        with _postgres_store():  # skips, or fails under CI, as every PostgreSQL test does
            pass
    assert PG_URL
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


def test_a_read_command_leaves_an_empty_postgresql_database_alone(
    empty_schema: str, tmp_path: Path
) -> None:
    """A read command on a database without the farm's tables refuses instead of migrating it
    into a store; `db upgrade` then makes it one."""
    env = store_env(tmp_path / "home", empty_schema)
    done = run_process(env, "bed", "list", code=2)
    assert "no store at postgresql" in done.stderr and "apg-farm db upgrade" in done.stderr
    assert _contents(empty_schema) == {}
    made = run_process(env, "db", "upgrade")
    assert "created a new store" in made.stderr
    assert "alembic_version" in _contents(empty_schema)


# --- 2. a mistyped APG_FARM_* name is said --------------------------------------------------------


def test_a_mistyped_setting_is_warned_about_once_with_the_closest_name(
    farm: tuple[Path, str], tmp_path: Path
) -> None:
    """APG_FARM_DATABSE_URL would be ignored without a word: one warning names the real one;
    the test suite's own APG_FARM_TEST_* names are left alone."""
    home, url = farm
    env = store_env(home, url, APG_FARM_DATABSE_URL="sqlite:///x.db", APG_FARM_TEST_WHATEVER="1")
    done = run_process(env, "sweep", "status", "done")
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: APG_FARM_DATABSE_URL is not an apg-farm setting and is ignored; "
        "did you mean APG_FARM_DATABASE_URL?"
    ]
    quiet = run_process(store_env(home, url, APG_FARM_LEASE_SECONDS="60"), "bed", "list")
    assert "warning" not in quiet.stderr


def test_every_apg_farm_name_the_repository_uses_is_known() -> None:
    """A name the code, the Compose file or the image scripts read must never be warned about:
    this lists them all from the sources, so a new one cannot be forgotten."""
    sources = [
        *ROOT.glob("apg_farm/**/*.py"),
        *ROOT.glob("workers/**/*.py"),
        *ROOT.glob("scheduler/**/*.py"),
        *ROOT.glob("fixtures/**/*"),
        *ROOT.glob("images/**/*"),
        ROOT / "docker-compose.yml",
    ]
    used = set()
    for path in sources:
        if path.is_file() and path.suffix not in (".pyc", ".db"):
            text = path.read_text(errors="replace")
            used |= {m for m in re.findall(r"APG_FARM_[A-Z0-9_]+", text) if not m.endswith("_")}
    assert used, "no APG_FARM_ name found: the search is broken"
    assert {n for n in used if not n.startswith(TEST_PREFIXES)} - known_names() == set()


# --- 3. no traceback ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "said"),
    [
        ("garbage", "'garbage' is not a Redis URL"),
        ("amqp://guest@localhost//", "is not a Redis URL"),
        ("redis://localhost:99999/0", "Port out of range"),
        ("redis://localhost:6379/zero", "must be a number"),
    ],
)
def test_a_broker_url_that_is_not_redis(broker: str, said: str, farm: tuple[Path, str]) -> None:
    """Celery would take any URL and fail deep inside (a ValueError's traceback)."""
    home, url = farm
    before = _contents(url)
    done = run_process(
        store_env(home, url, APG_FARM_BROKER_URL=broker), "scheduler", "--once", code=2
    )
    assert done.stderr.startswith("error: APG_FARM_BROKER_URL: ")
    assert said in done.stderr and "redis://host:6379/0" in done.stderr
    assert _contents(url) == before


def test_a_home_that_is_a_file(tmp_path: Path) -> None:
    """APG_FARM_HOME naming a file is refused at once, by every command."""
    home = tmp_path / "home"
    home.write_text("not a folder")
    env = store_env(home, "")
    del env["APG_FARM_DATABASE_URL"]
    for args in (("bed", "list"), ("db", "upgrade")):
        done = run_process(env, *args, code=2)
        assert f"APG_FARM_HOME: {home} is a file, not a folder" in done.stderr
    assert home.read_text() == "not a folder"


def test_a_home_that_cannot_be_written(tmp_path: Path) -> None:
    """A home whose folder cannot be made: the command that would make the store says which
    folder and why; a read command finds no store there."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    env = store_env(blocker / "home", "")
    del env["APG_FARM_DATABASE_URL"]
    made = run_process(env, "db", "upgrade", code=2)
    assert f"cannot make the store's folder {blocker / 'home'}: Not a directory" in made.stderr
    assert "APG_FARM_HOME" in made.stderr
    read = run_process(env, "bed", "list", code=2)
    assert "no store at" in read.stderr


def test_a_sqlite_url_naming_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    """Read or write, the file is left as it was and the message says what it is."""
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n" * 100)
    env = store_env(tmp_path / "home", f"sqlite:///{notes}")
    for args in (("bed", "list"), ("db", "upgrade")):
        done = run_process(env, *args, code=2)
        assert "is not an apg-farm store: file is not a database" in done.stderr
        assert "APG_FARM_DATABASE_URL" in done.stderr
    assert notes.read_text() == "shopping list\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_export_onto_a_file(farm: tuple[Path, str], tmp_path: Path) -> None:
    """`--eee FILE` is refused before anything is written (it was a NotADirectoryError)."""
    home, url = farm
    target = tmp_path / "out.json"
    target.write_text("{}")
    done = run_process(store_env(home, url), "export", "done", "--eee", str(target), code=2)
    assert f"--eee: {target} is a file, not a folder" in done.stderr
    assert target.read_text() == "{}"


def test_export_into_a_folder_that_holds_files_needs_force(
    farm: tuple[Path, str], tmp_path: Path
) -> None:
    """An earlier export (or anything else) is not overwritten unless asked, and then said."""
    home, url = farm
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    refused = run_process(store_env(home, url), "export", "done", "--eee", str(out), code=2)
    assert f"--eee: {out} is not empty" in refused.stderr and "--force" in refused.stderr
    assert _files(out) == [out / "keep.txt"]
    forced = run_process(store_env(home, url), "export", "done", "--eee", str(out), "--force")
    assert f"writing into {out} (--force)" in forced.stderr
    assert "exported 1 attempt envelopes and 1 aggregates" in forced.stdout
    assert (out / "keep.txt").read_text() == "mine"
    assert any(p.suffix == ".json" for p in _files(out / "attempts"))


def test_export_into_a_new_folder_needs_no_force(farm: tuple[Path, str], tmp_path: Path) -> None:
    """The usual case is unchanged: a new folder is made and filled."""
    home, url = farm
    done = run_process(store_env(home, url), "export", "done", "--eee", str(tmp_path / "new"))
    assert "exported 1 attempt envelopes" in done.stdout and "--force" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("report", "99999999999999999999"),
        ("sweep", "status", "99999999999999999999"),
        ("export", "99999999999999999999", "--eee", "{tmp}/x"),
        ("report", "9223372036854775808"),
        ("report", "²"),
        ("report", "9" * 5000),
    ],
    ids=["report", "status", "export", "2**63", "superscript", "5000 digits"],
)
def test_a_sweep_id_beyond_64_bits_is_no_such_sweep(
    args: tuple[str, ...], farm: tuple[Path, str], tmp_path: Path
) -> None:
    """A number the database cannot hold is no sweep's id (it was an OverflowError)."""
    home, url = farm
    before = _contents(url)
    done = run_process(
        store_env(home, url), *(a.replace("{tmp}", str(tmp_path)) for a in args), code=2
    )
    assert done.stderr.startswith("error: no sweep ")
    assert not (tmp_path / "x").exists()
    assert _contents(url) == before
