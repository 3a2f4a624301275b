"""The project's other files, as the baseline left them (issue #28).

APG's reset restores the scoped git tree (`config/sync`, `web/modules/custom`, `recipes`), the
scratch paths, `settings*.php`, Composer's code and the database, and the farm looks after
`.ai-proving-ground/` (the evidence move), `.git` (git_baseline.py), the folders reset keeps
(kept_paths.py, all git-ignored) and `.ddev/` and `drush/` (the DDEV configuration's
fingerprint). Every other file of the project
that git sees stays through every reset: an answer an agent writes at the project root, a tracked
file it edits outside the scope, the CLAUDE.md, AGENTS.md or `.claude/` a coding agent loads. The
next agent reads them.

So the farm lists those files with `git status` (tracked ones that differ from the index, which
the git clean-up has just rebuilt from the baseline's HEAD, and untracked ones git does not
ignore) when the bed's baseline is recorded and after each reset, before the run. On a bed whose
baseline lists none (a clean tree), anything listed is an earlier agent's and is put back: tracked
files checked out again, untracked ones removed (`git clean`), their names kept in the phase's
record and a bed event. A bed whose baseline lists some cannot be put back that way (the farm
keeps no copy of them): a listing that differs from the baseline's retries the attempt elsewhere
and quarantines the bed (escrow it again on a clean tree). What git ignores is not listed: it is
Composer's code, the settings files, the files folders and the run folders, looked after above.
"""

from __future__ import annotations

from dataclasses import dataclass

from apg_farm.beds.git_baseline import GIT_PREAMBLE, run_git_script
from apg_farm.errors import ContractViolation
from apg_farm.store import Bed
from apg_farm.transports import CommandResult, Transport

#: bed.meta key of the listing at the bed's baseline.
WORKTREE = "worktree"
#: Paths others look after (module docstring), left out of the listing as git pathspecs.
LOOKED_AFTER = (
    "config/sync",
    "web/modules/custom",
    "web/themes/custom",
    "recipes",
    ".ai-proving-ground",
    ".ddev",
    "drush",
)
#: Listed paths kept in a record (bed.meta, a bed event, a phase's summary) at most.
SHOWN = 20
#: Characters of one listed name kept in a label.
NAME_SHOWN = 160
TIMEOUT = 120.0
#: Stdout read at most: a listing longer than this is cut, and counts as differing.
STDOUT_LIMIT = 256 << 10

# $1 approot, $2 list | clean, then the pathspec. Prints `FARM_WORKTREE none` (no repository),
# or `FARM_WORKTREE listed` and `git status --porcelain` lines (names C-quoted when unusual);
# `clean` first checks tracked files out again and removes untracked ones, then lists.
_SCRIPT = (
    GIT_PREAMBLE
    + r"""
mode=$1; shift
if [ ! -e .git ] && [ ! -L .git ]; then echo "FARM_WORKTREE none"; exit 0; fi
if [ "$mode" = clean ]; then
  # Only when a tracked file differs: with none matching, checkout refuses the pathspec.
  g diff --quiet -- "$@" >&2 || g checkout -q -- "$@" >&2 || fail "git checkout failed"
  g clean -ffdq -- "$@" >&2 || fail "git clean failed"
fi
out=$(g -c core.quotePath=true status --porcelain=v1 --untracked-files=all --ignored=no \
  -- "$@") || fail "git status failed"
echo "FARM_WORKTREE listed"
[ -z "$out" ] || printf '%s\n' "$out"
"""
)


def worktree_argv(approot: str, mode: str) -> tuple[str, ...]:
    """The one host command that lists (or first puts back, `clean`) the project's other files."""
    pathspec = (".", *(f":(top,exclude){path}" for path in LOOKED_AFTER))
    return ("/bin/sh", "-c", _SCRIPT, "apg-farm-worktree", approot, mode, *pathspec)


@dataclass(frozen=True)
class Worktree:
    """The listing: each entry `XY path` as git prints it; `repository` False without .git."""

    entries: tuple[str, ...] = ()
    repository: bool = True
    #: The listing was longer than the farm reads: `entries` holds its beginning.
    cut: bool = False

    def as_meta(self) -> dict[str, object]:
        return {"repository": self.repository, "entries": list(self.entries), "cut": self.cut}

    @classmethod
    def from_meta(cls, meta: object) -> Worktree | None:
        if not isinstance(meta, dict):
            return None
        entries, repository = meta.get("entries"), meta.get("repository")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            return None
        if not isinstance(repository, bool):
            return None
        return cls(tuple(entries), repository, meta.get("cut") is True)

    def label(self) -> str:
        if not self.repository:
            return "no git repository: nothing listed"
        # Agent-made names (git C-quotes control characters): each cut, so a label stays short.
        shown = ", ".join(
            e if len(e) <= NAME_SHOWN else e[:NAME_SHOWN] + "..." for e in self.entries[:SHOWN]
        )
        more = f" and {len(self.entries) - SHOWN} more" if len(self.entries) > SHOWN else ""
        count = f"more than {len(self.entries)}" if self.cut else str(len(self.entries))
        return f"{count} files differ from the index" + (f": {shown}{more}" if self.entries else "")


def parse_worktree(result: CommandResult) -> Worktree | str:
    """The listing a run of the script printed, or why it cannot be read (a short phrase)."""
    if result.transport_error:
        return f"transport failed: {result.transport_error}"
    if result.timed_out:
        return "timed out"
    lines = result.stdout.text().splitlines()
    if result.stdout.truncated:
        # Cut by the farm's bound (an agent can make many files): the beginning, marked cut.
        if lines[:1] != ["FARM_WORKTREE listed"]:
            return "the listing was longer than the farm reads"
        return Worktree(tuple(line for line in lines[1:-1] if line), cut=True)
    failed = next((line for line in lines if line.startswith("FARM_GIT_FAIL ")), None)
    if result.rc != 0 or failed:
        return failed.removeprefix("FARM_GIT_FAIL ") if failed else f"exit {result.rc}"
    if lines[:1] == ["FARM_WORKTREE none"]:
        return Worktree(repository=False)
    if lines[:1] != ["FARM_WORKTREE listed"]:
        return "no FARM_WORKTREE line"
    return Worktree(tuple(line for line in lines[1:] if line))


def read_worktree(bed: Bed, *, transport: Transport) -> Worktree:
    """The listing at the bed's baseline (with the escrow record); raises ContractViolation when
    it cannot be taken."""
    argv = worktree_argv(bed.approot, "list")
    found = parse_worktree(run_git_script(bed, transport, argv, TIMEOUT, STDOUT_LIMIT))
    if isinstance(found, str):
        raise ContractViolation(
            f"bed {bed.name}: cannot list the project's files under {bed.approot}: {found}",
            fix="check the bed's approot and its git repository, then escrow it again",
        )
    return found


__all__ = [
    "LOOKED_AFTER",
    "STDOUT_LIMIT",
    "TIMEOUT",
    "WORKTREE",
    "Worktree",
    "parse_worktree",
    "read_worktree",
    "worktree_argv",
]
