"""Settings read from files (APG_FARM_*_FILE): the way to keep a password out of every
environment; a file its group or others can read is refused by name, with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from apg_farm.dashboard import load_token
from apg_farm.errors import BadInput
from apg_farm.settings import load_settings

URL = "postgresql://apg:s3cret@db.example:5432/farm"


@pytest.fixture(autouse=True)
def _no_secret_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: the runner's own store or broker settings would collide."""
    for name in ("DATABASE_URL", "DB_PASSWORD", "BROKER_URL"):
        monkeypatch.delenv(f"APG_FARM_{name}", raising=False)
        monkeypatch.delenv(f"APG_FARM_{name}_FILE", raising=False)


def _private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_each_secret_setting_reads_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The URL, password and broker come from their files' first line, whitespace trimmed."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL_FILE", str(_private(tmp_path / "db", URL + "\n")))
    monkeypatch.setenv(
        "APG_FARM_BROKER_URL_FILE", str(_private(tmp_path / "b", "redis://:pw@r:6379/0"))
    )
    settings = load_settings()
    assert settings.database_url == URL
    assert settings.broker_url == "redis://:pw@r:6379/0"
    monkeypatch.setenv(
        "APG_FARM_DATABASE_URL_FILE", str(_private(tmp_path / "u", "postgresql://apg@db/farm"))
    )
    monkeypatch.setenv("APG_FARM_DB_PASSWORD_FILE", str(_private(tmp_path / "pw", " p@ss/w\n")))
    assert load_settings().resolved_database_url() == "postgresql://apg:p%40ss%2Fw@db/farm"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_settings_file_others_can_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """Group- or world-readable: a typed error naming the variable and `chmod 600`."""
    path = _private(tmp_path / "db", URL, mode)
    monkeypatch.setenv("APG_FARM_DATABASE_URL_FILE", str(path))
    with pytest.raises(BadInput) as error:
        load_settings()
    text = error.value.render()
    assert text.startswith("APG_FARM_DATABASE_URL_FILE: ") and f"chmod 600 {path}" in text
    assert "s3cret" not in text


def test_a_missing_or_empty_file_and_a_value_given_twice_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each with a message that says what to do."""
    monkeypatch.setenv("APG_FARM_BROKER_URL_FILE", str(tmp_path / "absent"))
    with pytest.raises(BadInput, match="APG_FARM_BROKER_URL_FILE: cannot read"):
        load_settings()
    monkeypatch.setenv("APG_FARM_BROKER_URL_FILE", str(_private(tmp_path / "empty", "\n")))
    with pytest.raises(BadInput, match="empty; write the value on its first line"):
        load_settings()
    monkeypatch.setenv("APG_FARM_BROKER_URL_FILE", str(_private(tmp_path / "b", "amqp://x")))
    with pytest.raises(BadInput, match="not a Redis URL"):
        load_settings()
    monkeypatch.delenv("APG_FARM_BROKER_URL_FILE")
    monkeypatch.setenv("APG_FARM_DATABASE_URL", URL)
    monkeypatch.setenv("APG_FARM_DATABASE_URL_FILE", str(_private(tmp_path / "db", URL)))
    with pytest.raises(BadInput, match="both set; keep one"):
        load_settings()


def test_the_dashboard_token_reads_its_file(tmp_path: Path) -> None:
    """APG_FARM_DASHBOARD_TOKEN_FILE: the token from a private file; refused when others can
    read it or when the variable is set too."""
    token = "t" * 32
    path = _private(tmp_path / "token", token + "\n")
    loaded = load_token(tmp_path / "home", {"APG_FARM_DASHBOARD_TOKEN_FILE": str(path)})
    assert (loaded.value, loaded.source) == (token, str(path))
    path.chmod(0o644)
    with pytest.raises(BadInput, match=r"APG_FARM_DASHBOARD_TOKEN_FILE: .*chmod 600"):
        load_token(tmp_path / "home", {"APG_FARM_DASHBOARD_TOKEN_FILE": str(path)})
    path.chmod(0o600)
    with pytest.raises(BadInput, match="both set"):
        load_token(
            tmp_path / "home",
            {"APG_FARM_DASHBOARD_TOKEN_FILE": str(path), "APG_FARM_DASHBOARD_TOKEN": token},
        )
