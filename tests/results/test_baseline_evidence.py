"""`baseline list` says what a baseline's evidence rests on (#31, part 5). It said "verifies: yes"
for a baseline promoted from an unsealed sweep, whose only check is a digest that whoever edits
the file recomputes; only a sealed sweep's baseline verifies, and `check` and `compare` warn about
the others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apg_farm.results import analyse, build_baseline, seal, write_baseline
from apg_farm.results.baseline import content_digest
from apg_farm.store import Store, Sweep
from tests.results.test_exclusions import build
from tests.support.cli_runner import run_main


def _promote(store: Store, sweep: Sweep, name: str, folder: Path) -> Path:
    with store.read() as session:
        fresh = session.get_one(Sweep, sweep.id)
        session.expunge(fresh)
    return write_baseline(build_baseline(analyse(store, fresh), name=name), folder)


def test_only_a_sealed_sweeps_baseline_verifies(
    sqlite_only_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = sqlite_only_store
    folder = tmp_path / "baselines"
    _promote(store, build(store, "open", excluded=0), "open", folder)
    sealed_sweep = build(store, "kept", excluded=0)
    seal(store, sealed_sweep.id, directory=tmp_path / "seals")
    _promote(store, sealed_sweep, "kept", folder)
    # An edit with its digest recomputed: the file vouches for itself, nothing else does.
    forged = json.loads((folder / "open.json").read_text())
    forged["name"] = "forged"
    forged["cells"][0]["passed"] += 1
    forged["content_sha256"] = content_digest(forged)
    (folder / "forged.json").write_text(json.dumps(forged))
    edited = json.loads((folder / "kept.json").read_text())
    edited["name"] = "edited"
    edited["cells"][0]["passed"] += 1
    (folder / "edited.json").write_text(json.dumps(edited))

    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", "250")
    out, _ = run_main(monkeypatch, capsys, "baseline", "list", "--dir", str(folder), "--json")
    rows: dict[str, dict[str, Any]] = {row["name"]: row for row in json.loads(out)}
    assert (rows["kept"]["verifies"], rows["kept"]["sealed"]) == (True, True)
    for name in ("open", "forged"):
        assert (rows[name]["verifies"], rows[name]["sealed"]) == (False, False), name
        assert rows[name]["evidence"].startswith("unverified: its sweep was not sealed")
    assert rows["edited"]["verifies"] is False and rows["edited"]["problems"]
    out, _ = run_main(monkeypatch, capsys, "baseline", "list", "--dir", str(folder))
    assert "unverified: its sweep was not sealed" in out and "does not verify" in out
    assert "yes" not in out.split("evidence", 1)[1]

    # check and compare say it.
    out, err = run_main(
        monkeypatch,
        capsys,
        "check",
        str(folder / "open.json"),
        "kept",
        "--max-rate-drop",
        "1",
        "--max-error",
        "6",
    )
    assert "comes from a sweep that was not sealed" in (out + err)
    out, err = run_main(monkeypatch, capsys, "compare", str(folder / "open.json"), "kept")
    assert "comes from a sweep that was not sealed" in err
    out, err = run_main(monkeypatch, capsys, "compare", str(folder / "kept.json"), "kept")
    assert "not sealed" not in err
