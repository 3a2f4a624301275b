"""The farm's own checks of a run's claims (contract/claims.py is the policy).

The engine calls `read_before_run` right before the agent starts (what only the bed can have
made true: the agent files against the last commit) and `judge_run_claim` once the agent is
stopped and the trusted verify passed. Every check here runs on the trusted side: a command the
farm issues itself, or a file it reads with its own transport from a configuration whose
fingerprint was just checked unchanged. Nothing the run printed or recorded is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import yaml

from apg_farm import contract
from apg_farm.beds import CREDENTIAL_NAMES
from apg_farm.contract import (
    CLAIM_CHECKS,
    CONTINUE,
    Check,
    Finding,
    PhaseOutput,
    Reproduced,
    SiteState,
    Verdict,
    checks_for,
    is_credential_shaped,
    judge_reproduction,
)
from apg_farm.transports import CommandResult, ListingFailed

if TYPE_CHECKING:
    from apg_farm.workers.engine import _Attempt

#: The files the claude adapter compares with the last commit (APG_CLAUDE_PROJECT_CHANGED).
AGENT_FILES = ("CLAUDE.md", "AGENTS.md", "CLAUDE.local.md", ".claude", ".agents")
#: The only adapter whose own check the farm knows (`ddev ai-eval-claude check`).
CHECKED_ADAPTER = "claude"
#: Bytes of one DDEV configuration file the credential scan reads, and how many files.
CONFIG_READ_LIMIT = 256 * 1024
CONFIG_FILES_LIMIT = 64

#: `git status` of the agent files, with every program git could run from the repository's
#: config disabled (as the git clean-up runs it): exit 0 and nothing printed is "the same".
_PROJECT_FILES = r"""
set -u
cd -- "$1" 2>/dev/null || exit 3
for v in $(env | sed -n 's/^\(GIT_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
[ -d .git ] && [ ! -L .git ] || { echo "FARM_PROJECT_FILES no-git"; exit 0; }
export GIT_DIR="$1/.git" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 \
  GIT_OPTIONAL_LOCKS=0 GIT_CEILING_DIRECTORIES=/ LC_ALL=C
out=$(git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false \
  -c core.pager=cat status --porcelain --untracked-files=all --ignored=no -- \
  CLAUDE.md AGENTS.md CLAUDE.local.md .claude .agents) || exit 4
if [ -n "$out" ]; then echo "FARM_PROJECT_FILES changed"; printf '%s\n' "$out" | head -5
else echo "FARM_PROJECT_FILES same"; fi
"""


def project_files_argv(approot: str) -> tuple[str, ...]:
    """One `/bin/sh` command on the bed's host: do the agent files differ from the last commit?"""
    return ("/bin/sh", "-c", _PROJECT_FILES, "farm-project-files", approot)


def read_project_files(result: CommandResult) -> Finding:
    """The reading before the run, as the finding a PROJECT_CHANGED claim is judged by."""
    lines = result.stdout.text().splitlines()
    if result.rc != 0 or not lines or not lines[0].startswith("FARM_PROJECT_FILES "):
        why = result.transport_error or ("timed out" if result.timed_out else f"exit {result.rc}")
        return Finding(Reproduced.UNKNOWN, f"the reading before the run failed ({why})")
    state = lines[0].split()[1]
    if state == "changed":
        shown = ", ".join(line[3:] for line in lines[1:4])
        return Finding(
            Reproduced.YES, f"before the run they differed from the last commit: {shown}"
        )
    if state == "same":
        return Finding(Reproduced.NO, "before the run they were as the last commit has them")
    return Finding(Reproduced.NO, "the project has no git repository, so no last commit to differ")


def read_before_run(attempt: _Attempt) -> Verdict:
    """Right before the run, on the bed's host: the agent files against the last commit, which
    only the bed can have made differ (the agent has not started). Never stops the attempt."""
    if attempt.harness is not None or attempt.claim.spec.agent != CHECKED_ADAPTER:
        return CONTINUE
    _, result = attempt._phase_result(
        "project_files", project_files_argv(attempt.bed.approot), attempt.claim.spec.timeouts.verify
    )
    attempt.project_files = read_project_files(result)
    return CONTINUE


def judge_run_claim(attempt: _Attempt, verdict: Verdict) -> Verdict:
    """The run's claim (a start or bed-configuration token, `attempted: false`, no run record,
    a run timeout, a link that dropped), judged by the farm's own checks of it."""
    checks: dict[Check, Callable[[_Attempt], Finding]] = {
        Check.ADAPTER: _adapter,
        Check.INSTALL: _install,
        Check.CREDENTIALS: _credentials,
        Check.SSH_KEYS: _ssh_keys,
        Check.PROJECT_FILES: _project_files,
    }
    needed = checks_for(verdict.claims)
    if Check.INSTALL in needed:
        needed.discard(Check.ADAPTER)  # the install check ends with the adapter's own check
    findings = {check: checks[check](attempt) for check in sorted(needed)}
    if Check.INSTALL in findings:
        findings.setdefault(Check.ADAPTER, findings[Check.INSTALL])
    site = attempt._site() if _needs_site(verdict, findings) else _NOT_READ
    return judge_reproduction(
        verdict,
        findings,
        site=site,
        run_seconds=attempt.run_seconds,
        window=attempt.engine.policy.start_window,
    )


#: Stands for the diff where the checks decided the claim and the fallback rule is not used.
_NOT_READ = SiteState(unchanged=False, evidence="the diff was not needed")


def _needs_site(verdict: Verdict, findings: dict[Check, Finding]) -> bool:
    # The diff is read only when the fallback rule needs it (a check could not run, or none
    # applies): a claim the checks decide costs no diff.
    results = [findings[CLAIM_CHECKS[c]].result for c in verdict.claims if c in CLAIM_CHECKS]
    if Reproduced.YES in results:
        return False
    return not results or any(r != Reproduced.NO for r in results)


def _adapter(attempt: _Attempt) -> Finding:
    """`ddev ai-eval-claude check` (the adapter's own test of its token, one short call)."""
    if attempt.claim.spec.agent != CHECKED_ADAPTER:
        return Finding(
            Reproduced.UNKNOWN,
            f"the {attempt.claim.spec.agent} adapter has no check the farm knows",
        )
    output, _ = attempt._phase_result(
        "claim_check",
        contract.claude_check(attempt.bed.ddev),
        attempt.claim.spec.timeouts.verify,
    )
    return _checked(output)


def _checked(output: PhaseOutput) -> Finding:
    if output.transport_error or output.timed_out or output.unknown_command:
        why = (
            "the bed lacks `ai-eval-claude`"
            if output.unknown_command
            else output.transport_error or "it timed out"
        )
        return Finding(Reproduced.UNKNOWN, f"`ai-eval-claude check` could not run: {why}")
    if output.exit_code == 0:
        return Finding(Reproduced.NO, "`ai-eval-claude check` passed: the bed's token works")
    tokens = ", ".join(dict.fromkeys(t.name for t in output.tokens)) or "no token"
    return Finding(
        Reproduced.YES, f"`ai-eval-claude check` failed (exit {output.exit_code}, {tokens})"
    )


def _install(attempt: _Attempt) -> Finding:
    """The adapter's check on a fresh install: the agent can change the install in the web
    container (README), so a container bed is restarted first (a restart removes it), with the
    trusted process listing taken again; a host-side install is checked as it is."""
    if attempt.bed.web_container and attempt.claim.spec.agent == CHECKED_ADAPTER:
        output = attempt._phase(
            "claim_restart", contract.restart(attempt.bed.ddev), attempt.claim.spec.timeouts.reset
        )
        if output.exit_code != 0:
            return Finding(
                Reproduced.YES,
                f"the web container could not be restarted (exit {output.exit_code})",
            )
        fresh = attempt._container_processes("processes_restart")
        if isinstance(fresh, Verdict):
            return Finding(Reproduced.YES, fresh.reason)
        attempt._trust(fresh)
    return _adapter(attempt)


def _ssh_keys(attempt: _Attempt) -> Finding:
    """`ddev exec ssh-add -l`: exit 0 lists keys of an agent the web container reaches (what
    `ddev auth ssh` gives it); 1 (no keys) or 2 (no agent) is none. A host-only bed has no
    web container to ask."""
    if not attempt.bed.web_container:
        return Finding(Reproduced.UNKNOWN, "a host-only bed has no web container to ask")
    output = attempt._phase(
        "claim_ssh_keys",
        contract.web_exec(attempt.bed.ddev, ("ssh-add", "-l")),
        attempt.claim.spec.timeouts.verify,
    )
    if output.transport_error or output.timed_out:
        return Finding(Reproduced.UNKNOWN, "`ssh-add -l` did not finish")
    if output.exit_code == 0:
        return Finding(Reproduced.YES, "`ssh-add -l` in the web container lists keys")
    if output.exit_code in (1, 2):
        return Finding(Reproduced.NO, "no SSH agent with keys in the web container")
    return Finding(Reproduced.UNKNOWN, f"`ssh-add -l` exited {output.exit_code}")


def _project_files(attempt: _Attempt) -> Finding:
    return attempt.project_files or Finding(Reproduced.UNKNOWN, "no reading before the run")


def _credentials(attempt: _Attempt) -> Finding:
    """The farm's own scan of the project's DDEV configuration, checked unchanged against its
    fingerprint since before the attempt: a credential-shaped variable with a value (`.ddev/.env*`,
    `web_environment`) or a bind mount of a home credential folder (compose files)."""
    root = PurePosixPath(attempt.bed.approot) / ".ddev"
    transport = attempt.engine.transport
    try:
        listing = transport.list_dir(str(root))
    except ListingFailed as error:
        return Finding(Reproduced.UNKNOWN, f".ddev cannot be listed: {error.reason}")
    names = sorted(
        n
        for n in (listing or [])
        if n.startswith(".env")
        or (n.endswith((".yaml", ".yml")) and n.startswith(("config", "docker-compose")))
    )[:CONFIG_FILES_LIMIT]
    found: list[str] = []
    for name in names:
        data = transport.read_file(str(root / name), limit=CONFIG_READ_LIMIT)
        if data is not None:
            found += [
                f".ddev/{name}: {what}" for what in _shared(name, data.decode("utf-8", "replace"))
            ]
    if found:
        return Finding(Reproduced.YES, "; ".join(found[:5]))
    return Finding(Reproduced.NO, f"no host credential in {len(names)} DDEV configuration files")


def _shared(name: str, text: str) -> list[str]:
    """What one DDEV configuration file shares with the bed of the host's credentials."""
    if name.startswith(".env"):
        return _assigned(text.splitlines())
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(doc, dict):
        return []
    found = _assigned(str(item) for item in doc.get("web_environment") or [])
    for service in (
        (doc.get("services") or {}).values() if isinstance(doc.get("services"), dict) else []
    ):
        for volume in (service or {}).get("volumes") or [] if isinstance(service, dict) else []:
            source = volume.get("source") if isinstance(volume, dict) else str(volume).split(":")[0]
            parts = PurePosixPath(str(source or "")).parts
            hit = next((p for p in parts if p in CREDENTIAL_NAMES), None)
            if hit:
                found.append(f"mounts {source} ({hit})")
    return found


def _assigned(lines: Iterable[str]) -> list[str]:
    found = []
    for line in lines:
        text = str(line).strip().removeprefix("export ").strip()
        name, sep, value = text.partition("=")
        if sep and value.strip().strip("'\"") and is_credential_shaped(name.strip()):
            found.append(name.strip())
    return found


__all__ = ["judge_run_claim", "project_files_argv", "read_before_run", "read_project_files"]
