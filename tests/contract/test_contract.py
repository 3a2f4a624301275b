"""Tests for the contract: argv builders (contract/argv.py) and readers of recorded bed output."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from apg_farm import contract
from apg_farm.contract import (
    TOKENS,
    DdevFailure,
    Token,
    discover_run_id,
    parse_ddev_failure,
    parse_escrow_path,
    parse_json_report,
    parse_tokens,
    printed_run_ids,
    read_output,
    run_record,
    strip_ansi,
)
from apg_farm.errors import BadInput, ContractViolation, UnsafeArgument
from apg_farm.transports.base import Captured, CommandResult

RECORDED = Path(__file__).parent / "recorded"
RED_LINE = "\x1b[31m{}\x1b[0m\n"
DDEV = "/usr/local/bin/ddev"
GRADE_ARGV = (DDEV, "ai-eval-grade", "dv01_extra", "--run=20260814-101200-a1")
VERIFIER_ARGV = contract.trusted_verify(
    "/home/farm/escrow/my-bed/3f2a", "/srv/my-bed", restore=False
)


def recorded(name: str) -> bytes:
    return (RECORDED / name).read_bytes()


def result(
    argv: tuple[str, ...],
    rc: int | None,
    stderr: bytes = b"",
    stdout: bytes = b"",
    *,
    timed_out: bool = False,
    transport_error: str | None = None,
) -> CommandResult:
    return CommandResult(
        argv=argv,
        rc=rc,
        stdout=Captured(stdout, len(stdout), False),
        stderr=Captured(stderr, len(stderr), False),
        duration=1.0,
        timed_out=timed_out,
        transport_error=transport_error,
    )


# -- builders ------------------------------------------------------------------------------------


def test_fixture_commands_argv() -> None:
    """Provision, reset, doctor, escrow, verify and diff put fixtures after the command name."""
    fx = ["kb_docs", "canvas_home"]
    assert contract.provision(DDEV, fx) == (DDEV, "ai-eval-provision", *fx)
    assert contract.reset(DDEV, fx) == (DDEV, "ai-eval-reset", *fx)
    assert contract.doctor(DDEV, fx) == (DDEV, "ai-eval-doctor", *fx)
    assert contract.escrow(DDEV, fx) == (DDEV, "ai-eval-escrow", *fx)
    assert contract.escrow(DDEV, fx, force=True) == (DDEV, "ai-eval-escrow", *fx, "--force")
    assert contract.verify(DDEV, fx, restore=True) == (DDEV, "ai-eval-verify", *fx, "--restore")
    assert contract.verify(DDEV, fx, restore=False) == (DDEV, "ai-eval-verify", *fx)
    assert contract.diff(DDEV, fx) == (DDEV, "ai-eval-diff", *fx)
    assert contract.diff(DDEV, fx, run_id="r1") == (DDEV, "ai-eval-diff", *fx, "--run=r1")


def test_empty_fixtures_mean_default_set() -> None:
    """No fixtures passes no arguments, so the bed uses its default set."""
    assert contract.reset("ddev", []) == ("ddev", "ai-eval-reset")


def test_fixtures_as_one_string_refused() -> None:
    """A bare string for fixtures is refused instead of being split into characters."""
    with pytest.raises(BadInput):
        contract.reset(DDEV, "kb_docs")


def test_run_argv_with_all_options() -> None:
    """Run passes task then --agent, --dataset, --model."""
    argv = contract.run(
        DDEV, "dv01_view_build", agent="claude", dataset="droost_build_tasks", model="anthropic/m-1"
    )
    assert argv == (
        DDEV,
        "ai-eval-run",
        "dv01_view_build",
        "--agent=claude",
        "--dataset=droost_build_tasks",
        "--model=anthropic/m-1",
    )


def test_run_argv_omits_none_options() -> None:
    """An option whose value is None is left out."""
    assert contract.run(DDEV, "t1", agent=None, dataset=None, model="m") == (
        DDEV,
        "ai-eval-run",
        "t1",
        "--model=m",
    )


def test_grade_argv_positional_order() -> None:
    """Grade passes task, dataset, model positionally and the run id as --run last."""
    assert contract.grade(DDEV, "t1", dataset="ds", model="m", run_id="r1") == (
        DDEV,
        "ai-eval-grade",
        "t1",
        "ds",
        "m",
        "--run=r1",
    )
    assert contract.grade(DDEV, "t1", dataset=None, model=None, run_id="r1") == (
        DDEV,
        "ai-eval-grade",
        "t1",
        "--run=r1",
    )
    assert contract.grade(DDEV, "t1", dataset="ds", model=None, run_id=None) == (
        DDEV,
        "ai-eval-grade",
        "t1",
        "ds",
    )


def test_grade_model_without_dataset_refused() -> None:
    """Without a run id, a model without a dataset cannot be expressed, so it is refused."""
    with pytest.raises(BadInput) as info:
        contract.grade(DDEV, "t1", dataset=None, model="m", run_id=None)
    assert info.value.field == "model"


def test_grade_model_without_dataset_uses_run_json() -> None:
    """With a run id and no dataset, the model is left to run.json (still checked if unsafe)."""
    assert contract.grade(DDEV, "t1", dataset=None, model="m", run_id="r1") == (
        DDEV,
        "ai-eval-grade",
        "t1",
        "--run=r1",
    )
    with pytest.raises(UnsafeArgument):
        contract.grade(DDEV, "t1", dataset=None, model="m x", run_id="r1")


def test_trusted_verify_argv() -> None:
    """The trusted verifier runs escrow-verify.sh with bash, approot then escrow set."""
    assert contract.trusted_verify("/e/set1", "/srv/bed", restore=True) == (
        "/usr/bin/bash",
        "/e/set1/escrow-verify.sh",
        "/srv/bed",
        "/e/set1",
        "--restore",
    )
    assert contract.trusted_verify("/e/set1/", "/srv/bed", restore=False, bash="/bin/bash") == (
        "/bin/bash",
        "/e/set1/escrow-verify.sh",
        "/srv/bed",
        "/e/set1",
    )


@pytest.mark.parametrize(
    ("escrow_set", "approot"),
    [("e/set1", "/srv/bed"), ("/e/set1", "srv/bed"), ("/e/../set1", "/srv/bed"), ("/", "/srv")],
)
def test_trusted_verify_needs_absolute_paths(escrow_set: str, approot: str) -> None:
    """Relative paths, '..' segments and the root directory are refused."""
    with pytest.raises(UnsafeArgument):
        contract.trusted_verify(escrow_set, approot, restore=False)


UNSAFE = [
    "has space",
    "a;b",
    "$(id)",
    "it's",
    'say"x"',
    "a\nb",
    "a\n",
    "-rf",
    "--run=x",
    "",
    "a`b`",
]


@pytest.mark.parametrize("value", UNSAFE)
def test_check_arg_refuses_unsafe(value: str) -> None:
    """Spaces, shell characters, quotes, newlines, a leading '-' and empty values are refused."""
    with pytest.raises(UnsafeArgument) as info:
        contract.check_arg("task", value)
    assert info.value.field == "task"


def test_check_arg_message_names_field_and_charset() -> None:
    """The error names the field and the allowed characters."""
    with pytest.raises(UnsafeArgument) as info:
        contract.check_arg("model", "a b")
    assert str(info.value).startswith("model: ")
    assert "letters, digits and . _ @ = : / -" in str(info.value)


def test_check_arg_accepts_safe() -> None:
    """Typical ids pass unchanged."""
    for value in ("dv01_view_build", "anthropic/claude-sonnet-5-5", "kb_docs@2", "a=b:c.d"):
        assert contract.check_arg("x", value) == value


BUILDERS: list[tuple[str, Callable[[str], tuple[str, ...]]]] = [
    ("ddev", lambda v: contract.reset(v, ["kb_docs"])),
    ("fixtures[1]", lambda v: contract.provision(DDEV, ["kb_docs", v])),
    ("fixtures[0]", lambda v: contract.verify(DDEV, [v], restore=True)),
    ("fixtures[0]", lambda v: contract.doctor(DDEV, [v])),
    ("fixtures[0]", lambda v: contract.escrow(DDEV, [v])),
    ("fixtures[0]", lambda v: contract.diff(DDEV, [v])),
    ("run_id", lambda v: contract.diff(DDEV, [], run_id=v)),
    ("task", lambda v: contract.run(DDEV, v)),
    ("agent", lambda v: contract.run(DDEV, "t", agent=v)),
    ("dataset", lambda v: contract.run(DDEV, "t", dataset=v)),
    ("model", lambda v: contract.run(DDEV, "t", model=v)),
    ("task", lambda v: contract.grade(DDEV, v)),
    ("dataset", lambda v: contract.grade(DDEV, "t", dataset=v)),
    ("model", lambda v: contract.grade(DDEV, "t", dataset="d", model=v)),
    ("run_id", lambda v: contract.grade(DDEV, "t", run_id=v)),
    ("escrow_set", lambda v: contract.trusted_verify(v, "/srv", restore=False)),
    ("approot", lambda v: contract.trusted_verify("/e", v, restore=False)),
    ("bash", lambda v: contract.trusted_verify("/e", "/srv", restore=False, bash=v)),
]


@pytest.mark.parametrize(("field", "build"), BUILDERS)
@pytest.mark.parametrize("value", ["a b", "x;rm", "$(id)", "'", "a\nb", "-x", ""])
def test_every_builder_checks_every_argument(
    field: str, build: Callable[[str], tuple[str, ...]], value: str
) -> None:
    """Each variable argument of each builder is checked and named in the error."""
    with pytest.raises(UnsafeArgument) as info:
        build(value)
    assert info.value.field == field


@pytest.mark.parametrize("value", ["a/b", "..", "."])
def test_run_id_must_be_one_directory_name(value: str) -> None:
    """A run id with '/' or equal to '.'/'..' is refused: it names a directory under runs/."""
    with pytest.raises(UnsafeArgument):
        contract.grade(DDEV, "t", run_id=value)


# -- ANSI and tokens -----------------------------------------------------------------------------


def test_strip_ansi_colours_and_other_sequences() -> None:
    """SGR colours, cursor CSI sequences, OSC titles and stray ESC are removed."""
    text = "\x1b[1;31mred\x1b[0m \x1b[2K\x1b[?25lgone\x1b]0;title\x07 ok\x1b(B\x1b"
    assert strip_ansi(text) == "red gone ok"


def test_all_contract_tokens_parsed_with_detail() -> None:
    """Every token in the contract's §3 table is recognised with its detail text."""
    tokens = parse_tokens(recorded("all_tokens.stderr").decode())
    names = [t.name for t in tokens]
    assert names == [
        "APG_GRADE_SKIP",
        "APG_GRADE_RUN_INVALID",
        "APG_GRADE_NOT_STORED",
        "APG_GRADE_NOT_SAVED",
        "APG_GRADE_DATASET_UNRESOLVED",
        "APG_GRADE_GRADER_UNRESOLVED",
        "APG_RUN_CRED_REFUSED",
        "APG_CLAUDE_NO_TOKEN",
        "APG_CLAUDE_TOKEN_UNSAFE",
        "APG_CLAUDE_SSH_KEYS",
        "APG_CLAUDE_INSTALL_FAILED",
        "APG_CLAUDE_AUTH_FAILED",
        "APG_CLAUDE_PROJECT_CHANGED",
        "APG_CLAUDE_NOT_A_TOKEN",
        "APG_CLAUDE_TIMEOUT",
        "APG_CLAUDE_FAILED",
        "APG_CLAUDE_TOKEN_LEAKED",
        "APG_PROVISION_UNTRACKED",
        "APG_PROVISION_STALE_BASELINE",
        "APG_FIXTURE_AMBIGUOUS",
        "APG_PROVISION_VERSIONS_UNRECORDED",
        "APG_RESET_UNTRACKED",
        "APG_RESET_GRADER_DRIFT",
        "APG_RESET_PACKAGE_DRIFT",
        "APG_RESET_COMPOSER_DRIFT",
        "APG_RESET_PENDING_UPDATES",
        "APG_RESET_GRADER_UNRECORDED",
        "APG_RESET_PACKAGE_SOURCE_EDITED",
        "APG_RESET_COMPOSER_CHANGED",
        "APG_RESET_CODE_DRIFT",
        "APG_RESET_FILES_UNRECORDED",
        "APG_RESET_PRIVATE_FILES_NOT_RESTORED",
        "APG_DIFF_UNRECORDED",
        "APG_DIFF_ERROR",
        "APG_ESCROW_MISMATCH",
        "APG_ESCROW_RESTORED",
        "APG_TAMPERED",
        "APG_ESCROW_NONE",
        "APG_ESCROW_UNSAFE",
        "APG_ESCROW_SKIPPED",
        "APG_ESCROW_OK",
    ]
    assert all(t.detail for t in tokens)
    by_name = {t.name: t.detail for t in tokens}
    assert by_name["APG_DIFF_UNRECORDED"] == "drupal"
    assert by_name["APG_TAMPERED"] == ".ddev/commands/web/ai-eval-grade modified"
    assert by_name["APG_GRADE_RUN_INVALID"] == "conflicting model: run.json says openai/gpt-5"


def test_unknown_future_token_parsed() -> None:
    """A token the contract does not list yet is still reported, detail stripped."""
    tokens = parse_tokens(recorded("future_token.stderr").decode())
    assert tokens == [Token("APG_SOMETHING_NEW", "with  detail"), Token("APG_ESCROW_OK", "")]


def test_noise_warnings_ansi_crlf_before_tokens() -> None:
    """Warnings, notices, colours, CRLF and a CR progress line do not hide tokens."""
    tokens = parse_tokens(recorded("reset_noisy.stderr").decode())
    assert tokens == [
        Token("APG_RESET_COMPOSER_CHANGED", "composer.lock differs from composer.kb_docs.lock"),
        Token("APG_RESET_CODE_DRIFT", "drupal/droost 1.2.0 -> 1.3.0"),
        Token("APG_RESET_PRIVATE_FILES_NOT_RESTORED", "/var/www/private"),
    ]


def test_token_must_start_the_line() -> None:
    """Mid-line mentions, lowercase and glued suffixes are not tokens."""
    text = "see APG_ESCROW_OK\nAPG_escrow_ok\nAPG_ESCROW_OK2\nXAPG_TAMPERED x\n"
    assert parse_tokens(text) == []


# -- DDEV failure lines --------------------------------------------------------------------------


def test_ddev_failure_host_form_coloured() -> None:
    """The host form (`; error=`) in red gives the command, args and real status."""
    text = recorded("verify_host_failure.stderr").decode()
    assert parse_ddev_failure(text) == DdevFailure(
        "ai-eval-verify", "kb_docs canvas_home", 2, "host"
    )


def test_ddev_failure_web_form_plain() -> None:
    """The web form (`: exit status`) without colour parses."""
    text = recorded("run_web_failure.stderr").decode()
    assert parse_ddev_failure(text) == DdevFailure(
        "ai-eval-run",
        "dv01_view_build --agent=claude --model=claude-sonnet-5-5",
        4,
        "web",
    )


def test_ddev_failure_crlf_and_no_args() -> None:
    """CRLF endings and a command run without arguments still parse."""
    text = "\x1b[31mFailed to run ai-eval-verify ; error=exit status 5\x1b[0m\r\n"
    assert parse_ddev_failure(text) == DdevFailure("ai-eval-verify", "", 5, "host")
    assert parse_ddev_failure("Failed to run ai-eval-doctor: exit status 1\r\n") == DdevFailure(
        "ai-eval-doctor", "", 1, "web"
    )


def test_ddev_failure_last_line_wins() -> None:
    """With several failure lines, the last one is the command's."""
    text = "Failed to run a x: exit status 2\nFailed to run b y; error=exit status 7\n"
    failure = parse_ddev_failure(text)
    assert failure is not None
    assert (failure.command, failure.status) == ("b", 7)


def test_ddev_failure_absent() -> None:
    """No failure line gives None."""
    assert parse_ddev_failure("APG_ESCROW_OK\n") is None
    assert parse_ddev_failure("Failed to run x: exit status ٣\n") is None


# -- read_output ---------------------------------------------------------------------------------


def test_grade_skip_exit_status_3() -> None:
    """A skip collapsed to rc 1 reads as exit 3 with APG_GRADE_SKIP."""
    out = read_output(result(GRADE_ARGV, 1, recorded("grade_skip.stderr")))
    assert out.observed_rc == 1
    assert out.exit_code == 3
    assert out.has("APG_GRADE_SKIP")
    assert out.first("APG_GRADE_SKIP") == Token("APG_GRADE_SKIP", "dv01_extra has no droost spec")
    assert out.ddev_failure is not None and out.ddev_failure.form == "web"
    assert out.names() == frozenset({"APG_GRADE_SKIP"})


def test_success_keeps_zero() -> None:
    """Observed rc 0 is exit 0 whatever stderr says."""
    out = read_output(result(GRADE_ARGV, 0, b"APG_GRADE_NOT_STORED importer missing\n"))
    assert out.exit_code == 0
    assert out.first("APG_GRADE_NOT_STORED") == Token("APG_GRADE_NOT_STORED", "importer missing")


@pytest.mark.parametrize("rc", [0, 2, 3, 124])
def test_a_failure_line_is_read_only_behind_rc_1(rc: int) -> None:
    """DDEV collapses a failure to exactly 1: with any other rc the command's own exit stands,
    and a `Failed to run … exit status 3` line (which the grade's site code can print) is text.
    A grade that exited 0 with it read as exit 3 would turn a verdict into SKIPPED."""
    stderr = RED_LINE.format("Failed to run ai-eval-grade dv01_extra: exit status 3").encode()
    out = read_output(result(GRADE_ARGV, rc, stderr))
    assert out.exit_code == rc and out.observed_rc == rc
    assert read_output(result(GRADE_ARGV, 1, stderr)).exit_code == 3


def test_rc_1_without_failure_line_stays_1() -> None:
    """Without a DDEV failure line the observed rc is the exit code."""
    out = read_output(result(GRADE_ARGV, 1, b"boom\n"))
    assert (out.exit_code, out.ddev_failure) == (1, None)


def test_host_failure_via_read_output() -> None:
    """A reset failure token with the host failure line reads as exit 1 and the fail token."""
    argv = contract.reset(DDEV, ["kb_docs", "canvas_home"])
    out = read_output(result(argv, 1, recorded("reset_failed.stderr")))
    assert out.exit_code == 1
    assert out.ddev_failure == DdevFailure("ai-eval-reset", "kb_docs canvas_home", 1, "host")
    assert out.has("APG_RESET_PENDING_UPDATES")


def test_killed_or_not_run_has_no_exit_code() -> None:
    """A timed-out or never-started command has exit_code None and says why."""
    out = read_output(result(GRADE_ARGV, None, timed_out=True))
    assert (out.exit_code, out.timed_out) == (None, True)
    out = read_output(result(GRADE_ARGV, None, transport_error="ssh: connection refused"))
    assert (out.exit_code, out.transport_error) == (None, "ssh: connection refused")


def test_project_start_failed() -> None:
    """`Failed to start project for custom command` is flagged as infrastructure."""
    out = read_output(result(GRADE_ARGV, 1, recorded("project_start_failed.stderr")))
    assert out.project_start_failed
    assert (out.exit_code, out.tokens, out.ddev_failure) == (1, (), None)


def test_unknown_command_builtin_error() -> None:
    """DDEV's own `Error: unknown command` is flagged, with no tokens and exit 1."""
    out = read_output(result(GRADE_ARGV, 1, recorded("unknown_command.stderr")))
    assert out.unknown_command
    assert (out.exit_code, out.tokens, out.ddev_failure, out.project_start_failed) == (
        1,
        (),
        None,
        False,
    )


def test_failure_line_for_another_command_ignored() -> None:
    """A failure line naming a command not in the argv does not change the exit code."""
    stderr = b"Failed to run ai-eval-diff kb_docs: exit status 9\n"
    assert read_output(result(GRADE_ARGV, 1, stderr)).exit_code == 1


def test_failure_line_saying_status_0_ignored() -> None:
    """rc 1 with `exit status 0` is still a failure."""
    stderr = b"Failed to run ai-eval-grade t: exit status 0\n"
    assert read_output(result(GRADE_ARGV, 1, stderr)).exit_code == 1


def test_non_utf8_stderr() -> None:
    """Invalid UTF-8 in stderr does not stop token parsing."""
    stderr = b"\xff\xfe garbage \x80\nAPG_ESCROW_OK \xc3(\n"
    out = read_output(result(VERIFIER_ARGV, 0, stderr))
    assert out.names() == frozenset({"APG_ESCROW_OK"})


VERIFIER_CASES = [
    ("verifier_ok.stderr", 0, 0, {"APG_ESCROW_OK"}),
    (
        "verifier_restored.stderr",
        0,
        0,
        {"APG_ESCROW_MISMATCH", "APG_ESCROW_RESTORED", "APG_ESCROW_OK"},
    ),
    ("verifier_mismatch.stderr", 1, 1, {"APG_ESCROW_MISMATCH"}),
    ("verifier_tampered.stderr", 1, 1, {"APG_TAMPERED"}),
    ("verifier_none.stderr", 2, 2, {"APG_ESCROW_NONE"}),
    ("verifier_unsafe.stderr", 1, 1, {"APG_ESCROW_UNSAFE"}),
    ("verifier_skipped.stderr", 0, 0, {"APG_ESCROW_SKIPPED", "APG_ESCROW_OK"}),
]


@pytest.mark.parametrize(("name", "rc", "exit_code", "names"), VERIFIER_CASES)
def test_trusted_verifier_outputs(name: str, rc: int, exit_code: int, names: set[str]) -> None:
    """The trusted verifier's real rc is kept and its tokens read."""
    out = read_output(result(VERIFIER_ARGV, rc, recorded(name)))
    assert out.exit_code == exit_code
    assert out.names() == names
    assert out.ddev_failure is None


def test_tampered_lists_every_path() -> None:
    """Each APG_TAMPERED line keeps its path and change."""
    out = read_output(result(VERIFIER_ARGV, 1, recorded("verifier_tampered.stderr")))
    assert [t.detail for t in out.tokens] == [
        ".ddev/commands/web/ai-eval-grade modified",
        "web/modules/contrib/ai_eval/modules/ai_eval_droost/src/New.php added",
    ]


def test_ddev_verify_via_wrapper() -> None:
    """`ddev ai-eval-verify` failing reads the real status from the host failure line."""
    argv = contract.verify(DDEV, ["kb_docs", "canvas_home"], restore=False)
    out = read_output(result(argv, 1, recorded("verify_host_failure.stderr")))
    assert out.exit_code == 2
    assert out.has("APG_TAMPERED")


# -- run ids -------------------------------------------------------------------------------------


def test_run_id_printed_after_label() -> None:
    """`Run ID: X` (coloured, CRLF) gives X."""
    text = recorded("run_stdout_run_id_colon.txt").decode()
    assert printed_run_ids(text) == ["20260814-101200-dv01_view_build-7f3a"]


def test_run_id_from_paths_and_hint() -> None:
    """runs/<X>/ paths and a --run=X hint give X once."""
    assert printed_run_ids(recorded("run_stdout_paths.txt").decode()) == ["20260814-1012-ab"]


def test_run_id_several_formats_unsafe_dropped() -> None:
    """run_id=, run id:, Run:, APG_RUN_ID all count; unsafe candidates are dropped."""
    text = recorded("run_stdout_mixed.txt").decode()
    assert printed_run_ids(text) == ["r-0001", "r-0002", "r-0003", "r-0004"]


def test_run_id_not_printed() -> None:
    """Output that names no run gives no candidates."""
    assert printed_run_ids(recorded("run_stdout_silent.txt").decode()) == []


def runs(docs: Mapping[str, object]) -> Callable[[str], Mapping[str, object] | None]:
    def read(run_id: str) -> Mapping[str, object] | None:
        doc = docs.get(run_id)
        if isinstance(doc, Exception):
            raise doc
        return doc if isinstance(doc, Mapping) else None

    return read


def test_discover_printed_id_accepted() -> None:
    """A printed id whose run.json names the task is the run id."""
    found = discover_run_id(
        task="t1",
        printed=["r2"],
        before={"r1"},
        after={"r1", "r2"},
        read_run_json=runs({"r2": {"task": "t1"}}),
    )
    assert found.run_id == "r2"
    assert "printed" in found.reason


def test_discover_new_directory_when_not_printed() -> None:
    """Without a printed id, the one new directory naming the task is used (task_id key too)."""
    found = discover_run_id(
        task="t1",
        printed=[],
        before={"r1"},
        after={"r1", "r2"},
        read_run_json=runs({"r1": {"task": "t1"}, "r2": {"task_id": "t1"}}),
    )
    assert found.run_id == "r2"


def test_discover_printed_naming_other_task_rejected() -> None:
    """A printed id whose run.json names another task is not accepted."""
    found = discover_run_id(
        task="t1",
        printed=["r2"],
        before=set(),
        after={"r2"},
        read_run_json=runs({"r2": {"task": "t9"}}),
    )
    assert found.run_id is None
    assert "t9" in found.reason


def test_discover_printed_wrong_but_new_dir_right() -> None:
    """A bad printed id falls back to the new directory naming the task."""
    found = discover_run_id(
        task="t1",
        printed=["bogus"],
        before=set(),
        after={"r3"},
        read_run_json=runs({"r3": {"task": "t1"}}),
    )
    assert found.run_id == "r3"


def test_discover_ambiguous_new_directories() -> None:
    """Two new directories naming the task and no printed id is ambiguous."""
    found = discover_run_id(
        task="t1",
        printed=[],
        before=set(),
        after={"r2", "r3"},
        read_run_json=runs({"r2": {"task": "t1"}, "r3": {"task": "t1"}}),
    )
    assert found.run_id is None
    assert found.reason.startswith("ambiguous:")


def test_discover_ambiguous_resolved_by_printed() -> None:
    """Several candidates: the printed one is preferred."""
    found = discover_run_id(
        task="t1",
        printed=["r3"],
        before=set(),
        after={"r2", "r3"},
        read_run_json=runs({"r2": {"task": "t1"}, "r3": {"task": "t1"}}),
    )
    assert found.run_id == "r3"


def test_discover_several_printed_is_ambiguous() -> None:
    """Two printed ids that both name the task are ambiguous."""
    found = discover_run_id(
        task="t1",
        printed=["r2", "r3"],
        before=set(),
        after={"r2", "r3"},
        read_run_json=runs({"r2": {"task": "t1"}, "r3": {"task": "t1"}}),
    )
    assert found.run_id is None
    assert found.reason.startswith("ambiguous:")


def test_discover_none() -> None:
    """No printed id and no new directory gives None with a reason."""
    found = discover_run_id(
        task="t1", printed=[], before={"r1"}, after={"r1"}, read_run_json=runs({})
    )
    assert found.run_id is None
    assert found.reason


def test_discover_new_dir_naming_other_task() -> None:
    """A new directory whose run.json names another task is not the attempt."""
    found = discover_run_id(
        task="t1",
        printed=[],
        before=set(),
        after={"r2"},
        read_run_json=runs({"r2": {"task": "t2"}}),
    )
    assert found.run_id is None
    assert "'t2'" in found.reason


def test_discover_old_printed_and_unreadable_and_unsafe() -> None:
    """A printed id that existed before, an unreadable run.json and an unsafe dir are skipped."""
    found = discover_run_id(
        task="t1",
        printed=["r1", "../x"],
        before={"r1"},
        after={"r1", "r2", "..", "bad name"},
        read_run_json=runs({"r1": {"task": "t1"}, "r2": OSError("denied")}),
    )
    assert found.run_id is None
    assert "existed before" in found.reason


def test_run_record_tolerant() -> None:
    """run.json keys are read with alternative names and string booleans and numbers."""
    rec = run_record(
        {"task_id": "t1", "model": "m", "agent": "claude", "attempted": "1", "exit_code": "3"}
    )
    assert (rec.task, rec.model, rec.adapter, rec.attempted, rec.adapter_exit_code) == (
        "t1",
        "m",
        "claude",
        True,
        3,
    )
    rec = run_record({"task": "t", "attempted": "false", "adapter_exit_code": 0})
    assert (rec.attempted, rec.adapter_exit_code) == (False, 0)
    rec = run_record({"attempted": "maybe", "adapter_exit_code": True, "task": 5})
    assert (rec.attempted, rec.adapter_exit_code, rec.task) == (None, None, None)
    assert run_record({}) == contract.RunRecord()


# -- JSON reports and escrow path ----------------------------------------------------------------


def test_json_report_clean() -> None:
    """A diff report that is only JSON parses."""
    report = parse_json_report(recorded("diff_report.stdout"), what="diff")
    assert report["changed"] is True
    assert report["config"] == {"added": ["views.view.kb"], "changed": [], "removed": []}


def test_json_report_with_noise() -> None:
    """Human lines around the object, even with braces, are skipped."""
    report = parse_json_report(recorded("doctor_noisy.stdout"), what="doctor")
    assert report["healthy"] is True


def test_json_report_inline_noise_and_ansi() -> None:
    """An object after text on the same line, with colours, still parses."""
    report = parse_json_report(b'\x1b[32mverdict:\x1b[0m {"healthy": false}\r\n', what="doctor")
    assert report == {"healthy": False}


def test_json_report_missing() -> None:
    """No JSON object raises ContractViolation naming the command."""
    with pytest.raises(ContractViolation, match="doctor"):
        parse_json_report(b"PHP Fatal error: boom {\n[1, 2]\n", what="doctor")
    with pytest.raises(ContractViolation):
        parse_json_report(b"", what="diff")


def test_json_report_truncated() -> None:
    """A truncated capture is a violation, not a partial report."""
    with pytest.raises(ContractViolation, match="truncated"):
        parse_json_report(b'{"a": 1}', what="diff", truncated=True)


def test_escrow_path_last_absolute_line() -> None:
    """The escrow path is the last absolute-path line, colours and CRLF stripped."""
    path = parse_escrow_path(recorded("escrow.stdout").decode())
    assert path == "/home/farm/.ai-proving-ground-escrow/my-bed/3f2a9c"


def test_escrow_path_missing_or_unsafe() -> None:
    """No usable absolute path raises ContractViolation."""
    for text in ("done\n", "", "/home/my user/escrow\n", "/tmp/../etc\n", "/\n"):
        with pytest.raises(ContractViolation):
            parse_escrow_path(text)


# -- robustness ----------------------------------------------------------------------------------


def test_random_bytes_never_crash_readers() -> None:
    """Random bytes, and stderr built at random from the contract's pieces (tokens with their
    details, DDEV failure lines for this command and for others, colours, CR and CRLF line ends,
    noise), each get what the reader owes them: a typed result or a ContractViolation, never
    another exception; every token line once, in order, its detail whole, none invented; the
    exit code the rule gives (only rc 1 reads the last failure line naming the command, unless
    it says 0); run ids, a report and an escrow path taken from the text, never made up."""
    rng = random.Random(7)
    alphabet = b'APG_\x1b[31m{}"\r\n :;=/-.0123456789Failed to run exit status error\xff\xc3'
    for _ in range(300):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        text = data.decode("utf-8", errors="replace")
        rc = rng.choice([None, 0, 1, 2])
        out = read_output(result(GRADE_ARGV, rc, data, data))
        assert out.observed_rc == rc
        assert (out.exit_code is None) == (rc is None)
        if rc is not None and rc != 1:
            assert out.exit_code == rc
        clean = strip_ansi(text)
        assert all(t.name.startswith("APG_") and t.name in clean for t in out.tokens)
        assert len(out.tokens) <= clean.count("APG_")
        for run_id in printed_run_ids(text):
            assert run_id in clean and contract.SAFE_ARG.fullmatch(run_id)
        try:
            report = parse_json_report(data, what="diff")
        except ContractViolation as error:
            assert "diff" in error.message
        else:
            assert isinstance(report, dict)
        try:
            path = parse_escrow_path(text)
        except ContractViolation:
            pass
        else:
            assert path.startswith("/") and path in clean
            assert not any(part in (".", "..") for part in path.split("/"))

    # Built stderr, with the answer known.
    names = [*sorted(TOKENS), "APG_FUTURE_TOKEN"]
    noise = "abcdefghijklmnopqrstuvwxyz0123456789 .,:;=/-"
    for _ in range(300):
        lines: list[str] = []
        expected: list[Token] = []
        failure: int | None = None
        for _ in range(rng.randint(0, 12)):
            kind = rng.random()
            if kind < 0.35:
                name = rng.choice(names)
                detail = "".join(rng.choice(noise) for _ in range(rng.randint(0, 90))).strip()
                lines.append(f"{rng.choice(['', ' ', '  '])}{name} {detail}")
                expected.append(Token(name, detail))
            elif kind < 0.5:
                status = rng.randint(0, 300)
                lines.append(f"Failed to run ai-eval-grade dv01_extra: exit status {status}")
                failure = status
            elif kind < 0.6:
                # Another command's failure line means nothing here.
                lines.append(f"Failed to run ai-eval-diff kb_docs: exit status {rng.randint(1, 9)}")
            else:
                lines.append("".join(rng.choice(noise) for _ in range(rng.randint(0, 60))))
        coloured = [
            RED_LINE.format(line).rstrip("\n") if rng.random() < 0.3 else line for line in lines
        ]
        text = "".join(line + rng.choice(["\n", "\r\n", "\r"]) for line in coloured)
        rc = rng.choice([0, 1, 1, 2, 3])
        out = read_output(result(GRADE_ARGV, rc, text.encode()))
        assert list(out.tokens) == expected, text
        assert parse_tokens(text) == expected
        if rc == 1 and failure:
            assert out.exit_code == failure and out.ddev_failure is not None
            assert out.ddev_failure.status == failure
        else:
            assert out.exit_code == rc
    # A report among human lines is the report, exactly.
    for _ in range(100):
        doc = {"changed": rng.choice([True, False]), "files": [rng.randint(0, 9) for _ in range(3)]}
        before = "".join(rng.choice(noise) for _ in range(rng.randint(0, 40)))
        after = "".join(rng.choice(noise) for _ in range(rng.randint(0, 40)))
        data = f"{before}\n{json.dumps(doc)}\n{after}\n".encode()
        assert parse_json_report(data, what="diff") == doc


def test_deep_nesting_report() -> None:
    """Deeply nested JSON is refused as a violation, not a RecursionError."""
    with pytest.raises(ContractViolation):
        parse_json_report(b"[" * 100000 + b"]" * 100000, what="diff")
