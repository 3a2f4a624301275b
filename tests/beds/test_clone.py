"""`apg-farm bed clone`: a new bed that is the same bed as an escrowed one, or nothing at all.

The clones here are made from container beds on the real Docker engine (fixtures/container,
`APG_FARM_TEST_BED_IMAGE`): skipped without them locally, a failure under CI. The bad-input
tests use host-only beds and need no engine.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from apg_farm.beds import (
    CloneRefused,
    CloneRequest,
    apply_inventory,
    clone_bed,
    doctor_bed,
    get_bed,
    load_inventory,
)
from apg_farm.beds.escrow import hash_escrow_set
from apg_farm.contract import Outcome
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedEvent, BedState, Execution, Store, quarantine_bed
from apg_farm.transports import LocalTransport
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_main
from tests.support.simbeds import bed_image, make_beds, spec

#: Every step of a container bed's clone, in order.
STEPS = [
    "make_folder",
    "source_escrow",
    "copy",
    "verify_copy",
    "ddev_config_copied",
    "project_name",
    "start",
    "reset",
    "escrow",
    "same_baseline",
    "verify",
    "doctor",
    "mounts",
    "enrol",
]
SET_KEY = simbed.set_key(["kb_docs", "canvas_home"])


@pytest.fixture(scope="module")
def image() -> str:
    return bed_image()


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[list[Path]]:
    """Approots whose containers are removed at the end, whatever the test did."""
    made: list[Path] = []
    yield made
    for approot in made:
        simbed.stop_container(approot)
    subprocess.run(
        [
            "docker",
            "rm",
            "--force",
            *_containers(label=f"com.ddev.approot={tmp_path}", prefix=True),
        ],
        capture_output=True,
        check=False,
    )


def _containers(*, label: str, prefix: bool = False) -> list[str]:
    """Names of containers (any state) carrying `label` (with `prefix`: a label value starting so)."""
    if not prefix:
        argv = ["docker", "ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.stdout.split()
    key, _, value = label.partition("=")
    argv = ["docker", "ps", "--all", "--format", '{{.Names}} {{.Label "' + key + '"}}']
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    rows = [line.split(" ", 1) for line in done.stdout.splitlines() if " " in line]
    return [name for name, owner in rows if owner.startswith(value)]


def _project(tmp_path: Path) -> str:
    """A clone's DDEV project name of this test's own: tests run in parallel on one engine, and
    a host refuses two projects of one name (`ddev start`)."""
    return "c" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]


def _source(store: Store, root: Path, folders: list[Path], image: str) -> Bed:
    (bed,) = make_beds(store, root, 1, image=image, prefix="src")
    folders.append(Path(bed.approot))
    return bed


def _clone(store: Store, name: str, folders: list[Path], **extra: Any) -> Any:
    folders.append(Path(extra.get("approot") or Path(get_bed(store, "src0").approot).parent / name))
    return clone_bed(store, CloneRequest(source="src0", name=name, **extra))


def _bed_names(store: Store) -> set[str]:
    with store.session() as session:
        return set(session.scalars(select(Bed.name)))


@pytest.mark.slow
def test_a_clone_is_the_same_bed_passes_doctor_and_runs_a_sweep(
    store: Store, tmp_path: Path, folders: list[Path], image: str
) -> None:
    """The clone is made beside its source, in its own container and project, at baseline with
    its own escrow set; doctor passes and a sweep runs on it alone."""
    # Given an escrowed container bed that an attempt left off baseline (a run, a built site)
    source = _source(store, tmp_path, folders, image)
    src_root = Path(source.approot)
    run_dir = src_root / ".ai-proving-ground" / "runs" / "20260101-000000-dv01_view_build-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text("{}\n")
    site = {"built": {"dv01_view_build": {"result": "pass", "failed": []}}, "dirty": True}
    (src_root / ".apg-sim" / "site.json").write_text(json.dumps(site))
    began = time.time()
    project = _project(tmp_path)
    # When it is cloned
    result = _clone(store, "src0-c1", folders, project=project)
    # Then every step ran and passed, in order, and the clone is enrolled in the source's pool
    assert [s.name for s in result.steps] == STEPS and all(s.ok for s in result.steps)
    clone = get_bed(store, "src0-c1")
    root = Path(clone.approot)
    assert root == src_root.parent / "src0-c1" and clone.state == BedState.ACTIVE
    assert (clone.pool, clone.fixtures, clone.env) == (source.pool, source.fixtures, source.env)
    assert clone.web_container and clone.transport == "local"
    # its own project, container and escrow set
    assert f"name: {project}" in (root / ".ddev" / "config.yaml").read_text()
    assert f"name: {src_root.name}" in (src_root / ".ddev" / "config.yaml").read_text()
    assert _containers(label=f"com.ddev.approot={root}") == [simbed.container_name(root)]
    assert _containers(label=f"com.ddev.site-name={project}") == [simbed.container_name(root)]
    assert _containers(label=f"com.ddev.approot={src_root}") == [simbed.container_name(src_root)]
    assert clone.escrow_set == str(tmp_path / "escrow" / project / SET_KEY)
    assert clone.escrow_set != source.escrow_set and clone.escrow_files
    assert clone.grader_tree_sha256 == source.grader_tree_sha256
    # the baseline pair copied, runs/ not; the database restored from the copied dump
    baseline = root / ".ai-proving-ground"
    assert (baseline / f"db.{SET_KEY}.sql").read_bytes() == (
        src_root / ".ai-proving-ground" / f"db.{SET_KEY}.sql"
    ).read_bytes()
    assert not (baseline / "runs").exists() or not any((baseline / "runs").iterdir())
    assert simbed.read_site(root) == {"built": {}, "dirty": False}
    # the DDEV commands each step uses ran in the clone, in this order
    ran = [
        e["command"]
        for e in simbed.read_log(root)
        if e.get("start", 0) >= began and "hook" not in e and e["command"] != "exec"
    ]
    assert [c for c in ran if c != "restart"] == [
        "config",
        "start",
        "ai-eval-reset",
        "ai-eval-escrow",
        "ai-eval-doctor",
    ]
    with store.session() as session:
        events = {(e.bed_id, e.kind) for e in session.scalars(select(BedEvent))}
    assert {(clone.id, "added"), (clone.id, "escrow"), (source.id, "cloned")} <= events
    # `bed doctor` passes, with the effective mounts checked
    healthy, verdict = doctor_bed(store, clone)
    assert healthy and verdict["effective_mounts"]["checked"], verdict
    # and a sweep runs on the clone alone
    quarantine_bed(store, "src0", "taken out so the clone runs every attempt")
    sweep_id = submit(store, spec("after", tasks=1, models=1, trials=2)).sweep_id
    done = EmbeddedExecutor(store, sweep_id).run()
    assert done.errors == [] and done.stranded == 0
    with store.session() as session:
        outcomes = [
            a.outcome for a in session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id))
        ]
        beds = {e.bed_id for e in session.scalars(select(Execution))}
    assert len(outcomes) == 2 and set(outcomes) <= {Outcome.PASSED, Outcome.FAILED}
    assert beds == {clone.id}


def _tamper_grader(root: Path) -> None:
    path = root / simbed.GRADER_CLASS_REL
    path.write_text(path.read_text() + "\n// always pass\n")


def _plant_hook(root: Path) -> None:
    (root / ".ddev" / "config.hook.yaml").write_text(
        "hooks:\n  pre-exec:\n    - exec-host: touch /tmp/apg-clone-hook\n"
    )


def _escrow_taken(root: Path) -> None:
    taken = root.parent.parent / "escrow" / _project(root.parent.parent) / SET_KEY
    taken.mkdir(parents=True)
    (taken / "escrow-verify.sh").write_text("# another bed's set\n")


def _name_taken(root: Path) -> None:
    other = root.parent / "elsewhere"
    simbed.create_bed(other, project=_project(root.parent.parent))
    simbed.start_container(other, image=bed_image())


#: How each refusal is brought about on the source (or its host), and the step that refuses.
REFUSALS: dict[str, tuple[Any, str, str]] = {
    "reset fails": (
        lambda r: simbed.write_faults(r, {"reset_fail": True}),
        "reset",
        "APG_RESET_GRADER_DRIFT",
    ),
    "escrow fails": (
        lambda r: simbed.write_faults(r, {"escrow_fail": True}),
        "escrow",
        "APG_ESCROW_UNSAFE",
    ),
    "escrow set of that project exists": (_escrow_taken, "escrow", "exists"),
    "judging code changed": (_tamper_grader, "verify_copy", "APG_TAMPERED"),
    "a DDEV hook planted": (_plant_hook, "ddev_config_copied", "config.hook.yaml added"),
    "project name in use": (_name_taken, "start", "a project (web container) already exists for"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_clone_that_fails_a_step_is_removed_and_not_enrolled(
    case: str, store: Store, tmp_path: Path, folders: list[Path], image: str
) -> None:
    """Whatever step refuses: no bed row, no folder, no container, no escrow set of the clone;
    the source untouched (its escrow set as recorded, its container running)."""
    source = _source(store, tmp_path, folders, image)
    src_root = Path(source.approot)
    spoil, step, needle = REFUSALS[case]
    spoil(src_root)
    if case == "project name in use":
        folders.append(src_root.parent / "elsewhere")
    root = src_root.parent / "src0-c1"
    project = _project(tmp_path)
    with pytest.raises(CloneRefused) as refused:
        _clone(store, "src0-c1", folders, project=project)
    error = refused.value
    assert error.steps[-1].name == step and not error.steps[-1].ok, error.render()
    assert needle in error.render()
    assert f"refused at step {step}" in error.render() and "nothing enrolled" in error.render()
    assert all(s.ok for s in error.steps[:-1])
    # nothing of the clone is left
    assert _bed_names(store) == {"src0"}
    assert not root.exists()
    assert _containers(label=f"com.ddev.approot={root}") == []
    escrow = tmp_path / "escrow" / project
    if case == "escrow set of that project exists":
        assert (escrow / SET_KEY / "escrow-verify.sh").read_text() == "# another bed's set\n"
    else:
        assert not escrow.exists()
    if case == "project name in use":  # the other project's container is not the clone's to remove
        assert _containers(label=f"com.ddev.site-name={project}") == [
            simbed.container_name(src_root.parent / "elsewhere")
        ]
    # the source as it was
    after = get_bed(store, "src0")
    assert after.state == BedState.ACTIVE
    assert (
        hash_escrow_set(after, str(after.escrow_set), transport=LocalTransport())
        == after.escrow_files
    )
    assert _containers(label=f"com.ddev.approot={src_root}") == [simbed.container_name(src_root)]
    assert f"name: {src_root.name}" in (src_root / ".ddev" / "config.yaml").read_text()


@pytest.fixture
def host_beds(tmp_path: Path, store: Store) -> Bed:
    """A host-only source (no engine needed): bad input is refused before anything is made."""
    (bed,) = make_beds(store, tmp_path, 1, prefix="src")
    return bed


@pytest.mark.parametrize(
    ("name", "extra", "field", "needle"),
    [
        ("a b", {}, "NAME", "not a bed name"),
        ("src0", {}, "NAME", "exists"),
        ("c1", {"approot": "relative/dir"}, "--approot", "absolute"),
        ("c1", {"approot": "/tmp/../etc/c1"}, "--approot", "absolute"),
        ("c1", {"approot": "/tmp/x;rm"}, "--approot", "letters, digits"),
        ("c1", {"approot": "INSIDE"}, "--approot", "source's project"),
        ("c1", {"approot": "EXISTS"}, "--approot", "exists"),
        ("c1", {"approot": "NO_PARENT"}, "--approot", "no folder"),
        ("c1", {"project": "a_b"}, "--project-name", "not a DDEV project name"),
        ("c1", {"project": "SOURCE"}, "--project-name", "named SOURCE already"),
        (
            "c1",
            {"ddev": "/usr/bin/ddev"},
            "--identity/--known-hosts/--trust-host-key/--ddev",
            "--ssh",
        ),
        ("c1", {"ssh": "no-user-here"}, "--ssh", "user@host"),
    ],
)
def test_bad_names_and_paths_are_bad_input(
    name: str,
    extra: dict[str, Any],
    field: str,
    needle: str,
    host_beds: Bed,
    store: Store,
    tmp_path: Path,
) -> None:
    root = Path(host_beds.approot)
    places = {
        "INSIDE": str(root / "web" / "c1"),
        "EXISTS": str(tmp_path / "bin"),
        "NO_PARENT": str(tmp_path / "no" / "such" / "c1"),
    }
    if extra.get("approot") in places:
        extra = {**extra, "approot": places[extra["approot"]]}
    if extra.get("project") == "SOURCE":  # the source's own DDEV project name
        project = simbed.project_name(root)
        extra, needle = {**extra, "project": project}, needle.replace("SOURCE", project)
    before = sorted(p.name for p in (tmp_path / "beds").iterdir())
    with pytest.raises(BadInput) as bad:
        clone_bed(store, CloneRequest(source="src0", name=name, **extra))
    assert bad.value.field == field and needle in bad.value.render(), bad.value.render()
    assert _bed_names(store) == {"src0"}
    assert sorted(p.name for p in (tmp_path / "beds").iterdir()) == before


def test_a_source_that_cannot_be_cloned_is_refused(store: Store, tmp_path: Path) -> None:
    """No such bed; a quarantined one; one without an escrow set: SOURCE named, nothing made."""
    make_beds(store, tmp_path, 2, prefix="src")
    with pytest.raises(BadInput, match="no bed named 'ghost'"):
        clone_bed(store, CloneRequest(source="ghost", name="c1"))
    quarantine_bed(store, "src0", "contaminated")
    with pytest.raises(BadInput, match="src0 is quarantined") as bad:
        clone_bed(store, CloneRequest(source="src0", name="c1"))
    assert bad.value.field == "SOURCE"
    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.name == "src1"))
        assert row is not None
        row.escrow_set, row.escrow_files = None, None
    with pytest.raises(BadInput, match="has no escrow set"):
        clone_bed(store, CloneRequest(source="src1", name="c1"))
    assert not (tmp_path / "beds" / "c1").exists()


def test_bed_clone_from_the_command_line(
    farm_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command: steps on stderr, one line on success; exit 2 on bad input, exit 1 with one
    error line when a step refuses (host-only beds: the command's wiring, not the engine)."""
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    make_beds(store, tmp_path, 1, prefix="src")
    out, err = run_main(monkeypatch, capsys, "bed", "clone", "src0", "c1")
    assert "bed c1 cloned from src0 and added to pool" in out
    assert "ok   verify_copy" in err and "ok   enrol" in err
    _, err = run_main(monkeypatch, capsys, "bed", "clone", "src0", "c 2", code=2)
    assert err.strip().splitlines()[-1].startswith("error: NAME:")
    simbed.write_faults(tmp_path / "beds" / "src0", {"reset_fail": True})
    out, err = run_main(monkeypatch, capsys, "bed", "clone", "src0", "c2", "--json", code=1)
    doc = json.loads(out)
    assert doc["enrolled"] is False and doc["steps"][-1] == {
        **doc["steps"][-1],
        "name": "reset",
        "ok": False,
    }
    assert "refused at step reset" in err and not (tmp_path / "beds" / "c2").exists()
    assert _bed_names(store) == {"src0", "c1"}
    store.dispose()


def _inventory(tmp_path: Path, source: Bed, *clones: dict[str, Any]) -> Path:
    data = {
        "defaults": {"host_only": True, "env": dict(source.env)},
        "beds": [
            {"name": source.name, "approot": source.approot, "ddev": source.ddev},
            *clones,
        ],
    }
    path = tmp_path / "beds.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_beds_apply_makes_the_clones_it_declares(store: Store, tmp_path: Path) -> None:
    """`count: 2, from: src0`: planned on a dry run, made once, kept after, removed when gone."""
    (source,) = make_beds(store, tmp_path, 1, prefix="src", config={"web_commands": []})
    folder = tmp_path / "clones"
    folder.mkdir()
    path = _inventory(
        tmp_path, source, {"name": "web", "from": "src0", "count": 2, "approot": str(folder)}
    )
    planned = apply_inventory(store, load_inventory(path), dry_run=True)
    assert [(c.action, c.bed) for c in planned.changes] == [
        ("keep", "src0"),
        ("clone", "web-1"),
        ("clone", "web-2"),
    ]
    assert _bed_names(store) == {"src0"} and not any(folder.iterdir())
    done = apply_inventory(store, load_inventory(path))
    assert done.failures == [] and done.count("clone") == 2
    for name in ("web-1", "web-2"):
        clone = get_bed(store, name)
        assert clone.approot == str(folder / name) and clone.pool == source.pool
        assert clone.escrow_set == str(tmp_path / "escrow" / name / SET_KEY)
    again = apply_inventory(store, load_inventory(path))
    assert [c.action for c in again.changes] == ["keep", "keep", "keep"]
    gone = apply_inventory(store, load_inventory(_inventory(tmp_path, source)))
    assert {(c.action, c.bed) for c in gone.changes} >= {("remove", "web-1"), ("remove", "web-2")}


def test_beds_apply_stops_at_a_refused_clone(
    farm_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first clone refused is removed, the next is not attempted, the command exits 1."""
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    (source,) = make_beds(store, tmp_path, 1, prefix="src", config={"web_commands": []})
    simbed.write_faults(Path(source.approot), {"reset_fail": True})
    path = _inventory(
        tmp_path, source, {"name": "web", "from": "src0", "count": 2, "approot": str(tmp_path)}
    )
    out, err = run_main(monkeypatch, capsys, "beds", "apply", str(path), code=1)
    assert "clone      web-1" in out and "clone      web-2" in out
    assert "clone web-1: clone web-1 of bed src0 refused at step reset" in err
    assert "not attempted: web-2" in err
    assert _bed_names(store) == {"src0"} and not (tmp_path / "web-1").exists()
    store.dispose()


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"name": "c", "from": "ghost", "approot": "/x"}, "'ghost' is not a bed of this file"),
        ({"name": "c", "count": 2, "approot": "/x"}, "count needs from"),
        ({"name": "c", "from": "b1", "host": "h", "approot": "/x"}, "takes host from its source"),
        ({"name": "c", "from": "b1", "approot": "/x", "env": {"A": "1"}}, "takes env"),
        ({"name": "b1", "from": "b1", "approot": "/x"}, "listed twice: b1"),
        ({"name": "c", "from": "b1", "count": 2, "approot": "/x"}, None),
        ({"name": "c", "from": "b1", "count": 0, "approot": "/x"}, "beds.1.count"),
    ],
)
def test_a_bad_clone_entry_names_the_field(
    tmp_path: Path, entry: dict[str, Any], needle: str | None
) -> None:
    data = {"hosts": {"h": {"ssh": "u@h"}}, "beds": [{"name": "b1", "approot": "/b1"}, entry]}
    path = tmp_path / "beds.yaml"
    path.write_text(yaml.safe_dump(data))
    if needle is None:
        assert [c.name for c in load_inventory(path).clones()] == ["c-1", "c-2"]
        return
    with pytest.raises(BadInput) as bad:
        load_inventory(path)
    assert needle in bad.value.render(), bad.value.render()


@pytest.mark.slow
def test_a_clone_over_ssh_on_a_netns_host_passes_doctor_and_runs_a_sweep(
    store: Store, tmp_path: Path, folders: list[Path], image: str
) -> None:
    """A container bed enrolled over SSH (a host in its own network namespace) is cloned on that
    host: every step over the same link, mounts asked of the host's Docker over ssh://, a sweep."""
    from apg_farm.beds import NewRemoteBed, add_remote_bed, enrol_escrow, run_provision
    from tests.support.netns import netns_hosts

    with netns_hosts(tmp_path / "hosts", 1) as (host,):
        host.sshd.pin()
        ddev = simbed.install_ddev(tmp_path / "remote" / "bin")
        approot = tmp_path / "remote" / "beds" / "src0"
        simbed.create_bed(approot, project="src0", config={"time_scale": 2000, "seed": 11})
        folders.append(approot)
        simbed.start_container(approot, image=image)
        add_remote_bed(
            store,
            NewRemoteBed(
                name="src0",
                ssh=host.sshd.ssh,
                approot=str(approot),
                ddev=str(ddev),
                identity=str(host.sshd.identity),
                known_hosts=str(host.sshd.known_hosts),
                env=(("AI_PG_ESCROW_DIR", str(tmp_path / "remote" / "escrow")),),
            ),
        )
        run_provision(get_bed(store, "src0"))
        enrol_escrow(store, get_bed(store, "src0"))
        # A clone whose reset fails is removed over the same link
        simbed.write_faults(approot, {"reset_fail": True})
        with pytest.raises(CloneRefused, match="refused at step reset"):
            _clone(store, "src0-bad", folders, project=_project(tmp_path) + "-bad")
        bad = approot.parent / "src0-bad"
        assert not bad.exists() and _containers(label=f"com.ddev.approot={bad}") == []
        assert _bed_names(store) == {"src0"}
        simbed.write_faults(approot, {})
        # When it is cloned (over SSH: the source's own transport)
        result = _clone(store, "src0-c1", folders, project=_project(tmp_path))
        assert [s.name for s in result.steps] == STEPS and all(s.ok for s in result.steps)
        clone = get_bed(store, "src0-c1")
        assert (clone.transport, clone.host, clone.ssh_port) == (
            "ssh",
            get_bed(store, "src0").host,
            get_bed(store, "src0").ssh_port,
        )
        root = Path(clone.approot)
        assert _containers(label=f"com.ddev.approot={root}") == [simbed.container_name(root)]
        assert clone.escrow_set == str(
            tmp_path / "remote" / "escrow" / _project(tmp_path) / SET_KEY
        )
        healthy, verdict = doctor_bed(store, clone)
        assert healthy and verdict["effective_mounts"]["checked"], verdict
        quarantine_bed(store, "src0", "taken out so the clone runs every attempt")
        sweep_id = submit(store, spec("after", tasks=1, models=1, trials=2)).sweep_id
        done = EmbeddedExecutor(store, sweep_id).run()
        assert done.errors == [] and done.stranded == 0
        with store.session() as session:
            executions = list(session.scalars(select(Execution)))
        assert {e.bed_id for e in executions} == {clone.id}
        assert {e.result for e in executions} <= {"PASSED", "FAILED"}


def test_the_simulated_bed_restores_its_database_from_the_dump(tmp_path: Path) -> None:
    """What the clone's reset relies on: the site comes back from `db.<set>.sql`, whatever it
    holds; a dump that is unreadable or gone fails the reset."""
    ddev = simbed.install_ddev(tmp_path / "bin")
    root = tmp_path / "bed"
    simbed.create_bed(root, project="bed", config={"time_scale": 2000})

    def ddev_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ddev), *args], cwd=root, capture_output=True, text=True, check=False
        )

    assert ddev_run("ai-eval-provision").returncode == 0
    dump = root / ".ai-proving-ground" / f"db.{SET_KEY}.sql"
    built = {"built": {"dv01_view_build": {"result": "pass", "failed": []}}, "dirty": False}
    dump.write_text(f"-- simulated database dump\n-- apg-sim-site: {json.dumps(built)}\n")
    assert ddev_run("ai-eval-reset").returncode == 0
    assert simbed.read_site(root) == built
    dump.write_text("-- apg-sim-site: {not json\n")
    done = ddev_run("ai-eval-reset")
    assert done.returncode == 1 and "ERROR 1064" in done.stderr
    dump.unlink()
    done = ddev_run("ai-eval-reset")
    assert done.returncode == 1 and "cannot restore the database" in done.stderr


@pytest.mark.slow
def test_a_clone_to_another_host_over_ssh_passes_doctor_and_runs_a_sweep(
    store: Store, tmp_path: Path, folders: list[Path], image: str
) -> None:
    """A local container bed cloned onto a host in its own network namespace (`--ssh`): the
    project and the source's escrow set carried through the farm, the clone enrolled over SSH;
    a clone there whose escrow fails is removed over the link, with the set copy."""
    from tests.support.netns import netns_hosts

    source = _source(store, tmp_path, folders, image)
    elsewhere = tmp_path / "host-b" / "beds"
    elsewhere.mkdir(parents=True)
    with netns_hosts(tmp_path / "hosts", 1) as (host,):
        host.sshd.pin()
        reach: dict[str, Any] = {
            "ssh": host.sshd.ssh,
            "identity": str(host.sshd.identity),
            "known_hosts": str(host.sshd.known_hosts),
        }
        simbed.write_faults(Path(source.approot), {"escrow_fail": True})
        bad = elsewhere / "src0-bad"
        folders.append(bad)
        with pytest.raises(CloneRefused, match="refused at step escrow"):
            clone_bed(
                store,
                CloneRequest(
                    "src0", "src0-bad", approot=str(bad), project=_project(tmp_path) + "-b", **reach
                ),
            )
        assert sorted(p.name for p in elsewhere.iterdir()) == []
        assert _containers(label=f"com.ddev.approot={bad}") == [] and _bed_names(store) == {"src0"}
        simbed.write_faults(Path(source.approot), {})
        root = elsewhere / "src0-c1"
        folders.append(root)
        result = clone_bed(
            store,
            CloneRequest("src0", "src0-c1", approot=str(root), project=_project(tmp_path), **reach),
        )
        assert [s.name for s in result.steps] == STEPS and all(s.ok for s in result.steps)
        assert "through the farm" in result.steps[2].detail
        assert sorted(p.name for p in elsewhere.iterdir()) == ["src0-c1"]  # no set copy left
        clone = get_bed(store, "src0-c1")
        assert (clone.transport, clone.host) == ("ssh", host.address)
        assert clone.pool == source.pool and clone.approot == str(root)
        assert not (root / ".ai-proving-ground" / "runs").exists() or not any(
            (root / ".ai-proving-ground" / "runs").iterdir()
        )
        healthy, verdict = doctor_bed(store, clone)
        assert healthy and verdict["effective_mounts"]["checked"], verdict
        quarantine_bed(store, "src0", "taken out so the clone runs every attempt")
        sweep_id = submit(store, spec("after", tasks=1, models=1, trials=2)).sweep_id
        done = EmbeddedExecutor(store, sweep_id).run()
        assert done.errors == [] and done.stranded == 0
        with store.session() as session:
            executions = list(session.scalars(select(Execution)))
        assert {e.bed_id for e in executions} == {clone.id}
