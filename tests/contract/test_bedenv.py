"""The environment a bed command gets: allow-list, forced settings, refused names."""

from __future__ import annotations

import pytest

from apg_farm.contract import (
    ALLOWED_BASE_NAMES,
    FORCED,
    bed_environment,
    is_credential_shaped,
    is_farm_setting,
)
from apg_farm.errors import BadInput

SECRET_VALUE = "postgresql://farm:hunter2@db/farm"


def test_only_allow_listed_names_come_from_base() -> None:
    """Names outside the allow-list, prefixes such as DDEV_ included, are dropped."""
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/farm",
        "DOCKER_HOST": "unix:///run/docker.sock",
        "APG_FARM_DATABASE_URL": SECRET_VALUE,
        "CELERY_BROKER_URL": "redis://:pw@broker/0",
        "AWS_SECRET_ACCESS_KEY": "abc",
        "DDEV_DEBUG": "true",
        "PYTHONPATH": "/farm",
        "SSH_AUTH_SOCK": "/tmp/agent.sock",
    }
    env = bed_environment(base=base)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/farm",
        "DOCKER_HOST": "unix:///run/docker.sock",
        "NO_COLOR": "1",
        "AI_PG_NO_IMPORT": "1",
    }


def test_default_base_is_os_environ_filtered(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no base, os.environ is read through the same allow-list."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL", SECRET_VALUE)
    monkeypatch.setenv("PATH", "/opt/bin:/usr/bin")
    monkeypatch.setenv("TZ", "UTC")
    env = bed_environment()
    assert "APG_FARM_DATABASE_URL" not in env
    assert SECRET_VALUE not in env.values()
    assert env["PATH"] == "/opt/bin:/usr/bin"
    assert env["TZ"] == "UTC"
    assert set(env) <= set(ALLOWED_BASE_NAMES) | set(FORCED)


def test_forced_settings_always_present() -> None:
    """NO_COLOR and AI_PG_NO_IMPORT are set even from an empty base."""
    assert bed_environment(base={}) == {"NO_COLOR": "1", "AI_PG_NO_IMPORT": "1"}


def test_extra_bed_settings_are_added() -> None:
    """Bed settings and the attempt label pass, and may override an allow-listed name."""
    extra = {
        "AI_PG_ESCROW_DIR": "/srv/escrow/bed1",
        "AI_PG_BASELINE_DIR": "/srv/baseline",
        "AI_PG_FIXTURES": "kb_docs canvas_home",
        "APG_FARM_ATTEMPT": "sweep1/task/model/0",
        "PATH": "/opt/ddev/bin:/usr/bin",
    }
    env = bed_environment(base={"PATH": "/usr/bin", "HOME": "/home/farm"}, extra=extra)
    assert env == {"HOME": "/home/farm", "NO_COLOR": "1", "AI_PG_NO_IMPORT": "1", **extra}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ai_pg_fixtures", "upper case"),
        ("1FIXTURES", "upper case"),
        ("AI-PG", "upper case"),
        ("", "upper case"),
        ("GITHUB_TOKEN", "credential"),
        ("AI_PG_SECRET", "credential"),
        ("DB_PASSWORD", "credential"),
        ("MYSQL_PASSWD", "credential"),
        ("GPG_PASSPHRASE", "credential"),
        ("OPENAI_API_KEY", "credential"),
        ("SSH_KEY_DIR", "credential"),
        ("AWS_CREDENTIALS_FILE", "credential"),
        ("SSH_AUTH_SOCK", "credential"),
        ("DATABASE_URL", "credential"),
        ("SENTRY_DSN", "credential"),
        ("CELERY_BROKER_URL", "credential"),
        ("REDIS_URL", "credential"),
        ("APG_FARM_DATABASE_URL", "credential"),
        ("APG_FARM_BED", "farm's own settings"),
        ("APG_FARM_ATTEMPTS", "farm's own settings"),
        ("NO_COLOR", "always sets"),
        ("AI_PG_NO_IMPORT", "always sets"),
    ],
)
def test_refused_names(name: str, why: str) -> None:
    """A refused name raises BadInput naming the variable and the reason, never the value."""
    with pytest.raises(BadInput) as caught:
        bed_environment(base={}, extra={name: SECRET_VALUE})
    message = str(caught.value)
    assert repr(name) in message
    assert why in message
    assert SECRET_VALUE not in message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("value", ["a\x00b", "line1\nline2", "a\rb", "trailing\n"])
def test_refused_values(value: str) -> None:
    """Values with NUL or line breaks are refused without echoing them."""
    with pytest.raises(BadInput) as caught:
        bed_environment(base={}, extra={"AI_PG_FIXTURES": value})
    assert "AI_PG_FIXTURES" in str(caught.value)
    assert "NUL or line break" in str(caught.value)
    assert value not in str(caught.value)


def test_is_credential_shaped_examples() -> None:
    """Credential markers match anywhere in the name, in any case."""
    for name in ("api_token", "X_SECRET_Y", "SshPrivateKey", "SESSION_COOKIE", "broker"):
        assert is_credential_shaped(name), name
    for name in ("PATH", "AI_PG_ESCROW_DIR", "AI_PG_FIXTURES", "APG_FARM_ATTEMPT", "TZ"):
        assert not is_credential_shaped(name), name


def test_is_farm_setting_examples() -> None:
    """APG_FARM_* is the farm's own, except the attempt label."""
    assert is_farm_setting("APG_FARM_BROKER_URL")
    assert is_farm_setting("apg_farm_store")
    assert not is_farm_setting("APG_FARM_ATTEMPT")
    assert not is_farm_setting("AI_PG_FIXTURES")


def test_allow_list_is_itself_safe() -> None:
    """No allow-listed or forced name is credential-shaped or a farm setting."""
    for name in (*ALLOWED_BASE_NAMES, *FORCED):
        assert not is_credential_shaped(name), name
        assert not is_farm_setting(name), name
