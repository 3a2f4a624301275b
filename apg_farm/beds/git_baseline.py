"""The bed's git repository as its baseline left it, recorded and put back before each agent.

APG's reset restores only the scoped tree (config/sync, web/modules/custom, recipes) from the
baseline git ref; refs, objects, stash, notes, reflogs, hooks and every other file under `.git`
stay. An earlier agent's answer committed on a side ref (or stashed, noted, left in a reflog or as
a dangling object) is then one `git log --all` away from the next agent. So the farm records the
baseline's refs (name -> sha, and HEAD) and the small files of `.git` (config, hooks, info/...)
when the bed's baseline is established (the escrow record: enrolment, `bed escrow`, `pool
upgrade`, `bed clone`), and before each run one command on the bed's host puts `.git` back:

- files outside objects/, refs/, logs/ (hooks, config, worktrees/, rebase state, FETCH_HEAD,
  anything an agent wrote there) removed unless recorded; a recorded one that changed is
  rewritten from its recorded bytes (kept for small non-hook files) or removed;
- reflogs removed (`logs/`), refs not in the baseline deleted (stash and notes are refs), moved
  ones and HEAD put back, stray files under refs/ removed, the index rebuilt from HEAD when it
  differs (a staged blob would keep an answer reachable);
- objects/: alternates, .keep/.promisor files and anything not an object or a pack removed,
  unreachable loose objects pruned, and when unreachable objects are left in packs (an agent can
  `git gc` its answer into one) everything repacked;
- then checked: the refs equal the baseline's, HEAD too, `git fsck --unreachable` finds nothing,
  no garbage under objects/.

`.git/config` is agent-writable and names programs git runs (core.fsmonitor, core.hooksPath,
gc.recentObjectsHook, include.path, ...): the script puts the recorded config back with plain
shell before any git command, and every git command runs with hooks, fsmonitor, pagers, editors
and credential helpers disabled on its command line, system and global config ignored and the
`GIT_*` environment cleared. The script needs only sh, git and coreutils/findutils, which APG's
host commands need already. A bed without `.git` (and none recorded) is left alone.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apg_farm.contract import bed_environment
from apg_farm.errors import ContractViolation
from apg_farm.store import Bed
from apg_farm.transports import CommandResult, Transport, host_environment

#: bed.meta key of the recorded git baseline.
GIT_BASELINE = "git_baseline"
#: Seconds the record and the clean-up may take on the bed's host.
GIT_TIMEOUT = 120.0
#: Exit code of the clean-up when `.git` cannot be put back (the reason is on stdout).
CLEAN_FAILED = 4
#: Bytes of a recorded file whose content is kept (config, description, info/exclude, ...).
CONTENT_LIMIT = 16 * 1024
#: Stdout of the record command read at most (refs and file hashes of one repository).
RECORD_LIMIT = 1 << 20

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_REF = re.compile(r"refs/[A-Za-z0-9._/@+-]{1,400}")
_PATH = re.compile(r"[A-Za-z0-9._/-]{1,200}")
_HEAD = re.compile(r"ref: refs/[A-Za-z0-9._/@+-]{1,400}|[0-9a-f]{40}|[0-9a-f]{64}")

# Shared by both scripts: no GIT_* variable of the caller, no system or global config, no
# program from the repository's config (restored first anyway), no terminal, no pager.
GIT_PREAMBLE = r"""
set -u
root=$1; shift
cd -- "$root" 2>/dev/null || { echo "FARM_GIT_FAIL approot $root is missing"; exit 4; }
for v in $(env | sed -n 's/^\(GIT_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export GIT_DIR="$root/.git" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
  GIT_TERMINAL_PROMPT=0 GIT_PAGER=cat PAGER=cat GIT_EDITOR=: EDITOR=: VISUAL=: \
  GIT_ASKPASS=/bin/false SSH_ASKPASS=/bin/false GIT_SSH_COMMAND=/bin/false \
  GIT_NO_REPLACE_OBJECTS=1 GIT_ATTR_NOSYSTEM=1 GIT_OPTIONAL_LOCKS=0 GIT_NO_LAZY_FETCH=1 \
  GIT_CEILING_DIRECTORIES=/ LC_ALL=C
g() {
  git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false \
    -c core.pager=cat -c core.editor=: -c core.askPass=/bin/false -c core.sshCommand=/bin/false \
    -c credential.helper= -c gc.auto=0 -c maintenance.auto=false -c protocol.allow=never \
    -c core.logAllRefUpdates=false -c core.commitGraph=false -c core.multiPackIndex=false \
    -c pack.writeBitmapHashCache=false -c repack.writeBitmaps=false "$@"
}
say() { echo "FARM_GIT $*"; }
fail() { echo "FARM_GIT_FAIL $*"; exit 4; }
"""

# Prints `absent`, or `head <HEAD file>`, `ref <sha> <name>` per ref, `file <sha256> <path>` per
# regular file of .git outside objects/ refs/ logs/ (and index, packed-refs), and
# `content <path> <base64>` for the small ones that are not hooks.
_RECORD = (
    GIT_PREAMBLE
    + r"""
if [ ! -e .git ] && [ ! -L .git ]; then echo absent; exit 0; fi
{ [ -d .git ] && [ ! -L .git ]; } || fail ".git is not a directory"
IFS= read -r head <.git/HEAD || fail "no .git/HEAD"
echo "head $head"
g for-each-ref --format='ref %(objectname) %(refname)' || fail "git for-each-ref failed"
cd .git || fail "cannot enter .git"
find . \( -path ./objects -o -path ./refs -o -path ./logs \) -prune -o -type f -print | sort |
while IFS= read -r p; do
  p=${p#./}
  case $p in index|packed-refs|*.lock) continue;; esac
  echo "file $(sha256sum <"$p" | cut -c1-64) $p"
  case $p in hooks/*) continue;; esac
  [ "$(wc -c <"$p")" -le %(limit)d ] && echo "content $p $(base64 -w0 <"$p")"
done
exit 0
"""
).replace("%(limit)d", str(CONTENT_LIMIT))

_CLEAN = (
    GIT_PREAMBLE
    + r"""
t=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$t"' EXIT
: >"$t/refs"; : >"$t/files"; : >"$t/content"; head=; absent=
for a in "$@"; do
  case $a in
    absent) absent=1;;
    head=*) head=${a#head=};;
    ref=*) printf '%s\n' "${a#ref=}" >>"$t/refs";;
    file=*) printf '%s\n' "${a#file=}" >>"$t/files";;
    content=*) printf '%s\n' "${a#content=}" >>"$t/content";;
  esac
done
# Write .git/$1 from its recorded bytes; fails when none were kept (a hook, a big file).
restore() {
  data=$(P=$1 awk 'index($0, ENVIRON["P"] " ") == 1 { print substr($0, length(ENVIRON["P"]) + 2); exit }' "$t/content")
  [ -n "$data" ] || return 1
  mkdir -p "$(dirname "$1")" && printf '%s' "$data" | base64 -d >"$1"
}
if [ ! -e .git ] && [ ! -L .git ]; then
  [ -n "$absent" ] || fail ".git is gone (the baseline had one)"
  say "absent"; exit 0
fi
if [ -n "$absent" ]; then
  # The baseline had no repository: this one is an agent's.
  rm -rf .git || fail "cannot remove the .git an agent made"
  say "removed .git (the baseline had none)"; exit 0
fi
{ [ -d .git ] && [ ! -L .git ]; } || fail ".git is not a directory"
cd .git || fail "cannot enter .git"
for d in objects refs; do { [ -d "$d" ] && [ ! -L "$d" ]; } || fail ".git/$d is not a directory"; done
# 1. Files outside objects/ refs/ logs/: recorded ones back, others removed (no git runs yet).
# The recorded names are plain ([A-Za-z0-9._/-]): any other name is an agent's, and goes first,
# so that one line per path below cannot be forged by a name holding a newline.
if [ -e logs ] || [ -L logs ]; then rm -rf logs && say "removed .git/logs (reflogs)"; fi
odd() { find . -name '*[!A-Za-z0-9._@+-]*' -prune "$@"; }
if [ -n "$(odd -print | head -c1)" ]; then
  odd -exec rm -rf -- {} + 2>/dev/null
  [ -z "$(odd -print | head -c1)" ] || fail "cannot remove odd names in .git"
  say "removed files of odd names in .git"
fi
find . \( -path ./objects -o -path ./refs \) -prune -o ! -type d ! -type f -print -exec rm -f -- {} + |
  sed 's|^\./|FARM_GIT removed .git/|'
find . \( -path ./objects -o -path ./refs \) -prune -o -type f -exec sha256sum -- {} + >"$t/have" ||
  fail "cannot hash the files of .git"
awk 'NR == FNR { want[substr($0, 66)] = substr($0, 1, 64); next }
     { p = substr($0, 67); sub(/^\.\//, "", p) }
     p == "index" || p == "packed-refs" || p == "HEAD" { next }
     want[p] != substr($0, 1, 64) { print p }' "$t/files" "$t/have" >"$t/off"
while IFS= read -r p; do
  rm -f -- "$p" || fail "cannot remove .git/$p"
  if restore "$p"; then say "restored .git/$p"; else rm -f -- "$p"; say "removed .git/$p"; fi
done <"$t/off"
while IFS= read -r line; do
  p=${line#* }
  if [ ! -e "$p" ] && restore "$p"; then say "restored .git/$p"; fi
done <"$t/files"
find . -mindepth 1 -depth -type d -empty ! -path ./objects ! -path ./refs ! -path ./objects/pack \
  ! -path ./objects/info ! -path ./refs/heads ! -path ./refs/tags -delete 2>/dev/null
# objects/: only loose objects and packs (no alternates, .keep or .promisor to protect an answer).
find objects ! -type d -exec /bin/sh -c '
  for p in "$@"; do
    case $p in
      objects/pack/pack-*.pack|objects/pack/pack-*.idx|objects/pack/pack-*.rev) [ -f "$p" ] && [ ! -L "$p" ] && continue;;
      objects/info/packs) [ -f "$p" ] && [ ! -L "$p" ] && continue;;
      objects/[0-9a-f][0-9a-f]/*)
        n=${p#objects/??/}
        case $n in *[!0-9a-f]*) ;; *) [ "${#n}" -ge 38 ] && [ -f "$p" ] && [ ! -L "$p" ] && continue;; esac;;
    esac
    rm -f -- "$p" || exit 4; echo "FARM_GIT removed .git/$p"
  done' sh {} + || fail "cannot clean .git/objects"
# refs/: only the baseline's loose refs as files (what git would not list, too).
find refs ! -type d ! -type f -print -exec rm -f -- {} + | sed 's|^|FARM_GIT removed .git/|'
find refs -type f | awk 'NR == FNR { want[$2] = 1; next } !($0 in want)' "$t/refs" - >"$t/strays"
while IFS= read -r p; do rm -f -- "$p" || fail "cannot remove .git/$p"; say "removed .git/$p"; done <"$t/strays"
# 2. HEAD, then refs: the baseline's, nothing else (stash and notes are refs too).
now_head=; lines=0
while IFS= read -r line; do now_head=$line; lines=$((lines + 1)); done <HEAD
if [ "$now_head" != "$head" ] || [ "$lines" != 1 ]; then
  printf '%s\n' "$head" >HEAD || fail "cannot write HEAD"; say "put back HEAD ($head)"
fi
cd "$root" || fail "cannot enter the approot"
g for-each-ref --format='%(objectname) %(refname)' >"$t/now" || fail "git for-each-ref failed"
awk 'NR == FNR { want[$2] = $1; next } !($2 in want) { print "delete " $2 }' "$t/refs" "$t/now" >"$t/tx"
awk 'NR == FNR { have[$2] = $1; next } have[$2] != $1 { print "update " $2 " " $1 }' "$t/now" "$t/refs" >>"$t/tx"
if [ -s "$t/tx" ]; then
  g update-ref --no-deref --stdin <"$t/tx" || fail "git update-ref failed"
  sed 's/^/FARM_GIT ref /' "$t/tx"
fi
# The index: a staged blob, or a resolve-undo record, keeps an answer reachable.
if ! g diff-index --cached --quiet HEAD -- 2>/dev/null || [ -n "$(g ls-files --resolve-undo 2>/dev/null | head -c1)" ]; then
  rm -f .git/index && g read-tree HEAD || fail "git read-tree HEAD failed"; say "index rebuilt from HEAD"
fi
# 3. Objects no baseline ref reaches: loose ones pruned, packed ones repacked away.
unreachable() {
  g fsck --connectivity-only --unreachable --no-reflogs --no-progress >"$t/fsck.out" 2>"$t/fsck"
  echo $? >"$t/fsck.rc"; grep -c '^unreachable ' "$t/fsck.out"
}
n=$(unreachable)
if [ "$n" != 0 ]; then
  g prune --expire=now || fail "git prune failed"
  say "pruned $n unreachable objects"
  n=$(unreachable)
fi
if [ "$n" != 0 ]; then
  # Left in packs (an agent can `git gc` its answer into one): every reachable object repacked.
  g repack -a -d -q -n || fail "git repack failed"
  g prune --expire=now >/dev/null 2>&1
  say "repacked away $n packed objects"
  n=$(unreachable)
fi
# 4. The check: what the next agent finds is the baseline.
if [ -s "$t/tx" ]; then
  g for-each-ref --format='%(objectname) %(refname)' >"$t/now" || fail "git for-each-ref failed"
fi
sort "$t/now" >"$t/after"
sort "$t/refs" | cmp -s - "$t/after" || fail "refs differ from the baseline after the clean-up: $(sort "$t/refs" | diff - "$t/after" | grep '^[<>]' | head -5 | tr '\n' ' ')"
IFS= read -r now_head <.git/HEAD; [ "$now_head" = "$head" ] || fail "HEAD differs from the baseline"
[ "$n" = 0 ] || fail "$n unreachable objects left"
[ "$(cat "$t/fsck.rc")" = 0 ] || fail "git fsck failed: $(grep -v '^unreachable ' "$t/fsck.out" "$t/fsck" | head -c 300 | tr '\n' ' ')"
garbage=$(g count-objects -v | sed -n 's/^garbage: //p')
[ "${garbage:-0}" = 0 ] || fail "$garbage garbage files in .git/objects"
[ ! -e .git/logs ] || fail "reflogs were written again"
say "clean"
"""
)


@dataclass(frozen=True)
class GitBaseline:
    """A bed's `.git` as its baseline left it (or its absence)."""

    absent: bool = False
    #: The HEAD file's line: `ref: refs/heads/main`, or a sha when detached.
    head: str = ""
    refs: Mapping[str, str] = field(default_factory=dict)
    #: sha256 of each regular file of .git outside objects/, refs/, logs/.
    files: Mapping[str, str] = field(default_factory=dict)
    #: base64 of the small ones that are not hooks, to put back when changed.
    content: Mapping[str, str] = field(default_factory=dict)

    def as_meta(self) -> dict[str, Any]:
        if self.absent:
            return {"absent": True}
        return {
            "head": self.head,
            "refs": dict(self.refs),
            "files": dict(self.files),
            "content": dict(self.content),
        }

    @classmethod
    def from_meta(cls, meta: object) -> GitBaseline | None:
        """The recorded baseline from bed.meta, or None when none (or none readable) is."""
        if not isinstance(meta, dict):
            return None
        if meta.get("absent") is True:
            return cls(absent=True)
        head, refs = meta.get("head"), meta.get("refs")
        files, content = meta.get("files", {}), meta.get("content", {})
        if not (
            isinstance(head, str)
            and _HEAD.fullmatch(head)
            and _str_map(refs, _REF, _SHA)
            and _str_map(files, _PATH, re.compile(r"[0-9a-f]{64}"))
            and _str_map(content, _PATH, re.compile(r"[A-Za-z0-9+/=]*"))
        ):
            return None
        return cls(head=head, refs=dict(refs or {}), files=files, content=content)

    def label(self) -> str:
        if self.absent:
            return "no git repository"
        return f"git HEAD {self.head}, {len(self.refs)} refs, {len(self.files)} files of .git"

    def clean_args(self) -> tuple[str, ...]:
        """The baseline as the clean-up script's arguments."""
        if self.absent:
            return ("absent",)
        return (
            f"head={self.head}",
            *(f"ref={sha} {name}" for name, sha in sorted(self.refs.items())),
            *(f"file={sha} {path}" for path, sha in sorted(self.files.items())),
            *(f"content={path} {data}" for path, data in sorted(self.content.items())),
        )


def _str_map(value: object, keys: re.Pattern[str], values: re.Pattern[str]) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) and keys.fullmatch(k) and values.fullmatch(v)
        for k, v in value.items()
    )


def record_argv(approot: str) -> tuple[str, ...]:
    """The one command that reads the bed's git baseline on its host."""
    return ("/bin/sh", "-c", _RECORD, "apg-farm-git-record", approot)


def clean_argv(approot: str, baseline: GitBaseline) -> tuple[str, ...]:
    """The one command that puts the bed's `.git` back to `baseline` and checks it."""
    return ("/bin/sh", "-c", _CLEAN, "apg-farm-git-clean", approot, *baseline.clean_args())


def parse_record(result: CommandResult) -> GitBaseline | str:
    """The baseline the record command printed, or why it cannot be believed."""
    if result.transport_error or result.timed_out:
        return result.transport_error or "timed out"
    text = result.stdout.text()
    if result.rc != 0:
        lines = [x for x in text.splitlines() if x.startswith("FARM_GIT_FAIL")]
        detail = lines[0] if lines else result.stderr.text().strip()[:300]
        return f"exit {result.rc}: {detail}"
    if result.stdout.truncated:
        return "its output was cut"
    if text.strip() == "absent":
        return GitBaseline(absent=True)
    head = ""
    refs: dict[str, str] = {}
    files: dict[str, str] = {}
    content: dict[str, str] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        first, _, second = rest.partition(" ")
        if kind == "head" and _HEAD.fullmatch(rest):
            head = rest
        elif kind == "ref" and _SHA.fullmatch(first) and _REF.fullmatch(second):
            refs[second] = first
        elif kind == "file" and re.fullmatch(r"[0-9a-f]{64}", first) and _PATH.fullmatch(second):
            files[second] = first
        elif kind == "content" and _PATH.fullmatch(first) and _b64(second):
            content[first] = second
        # Anything else (a file name git allows and this record does not) is left unrecorded:
        # the clean-up removes what is not recorded.
    if not head:
        return "no readable HEAD"
    content = {p: c for p, c in content.items() if p in files}
    return GitBaseline(head=head, refs=refs, files=files, content=content)


def _b64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def git_environment(transport: Transport, bed: Bed | None = None) -> dict[str, str]:
    """The environment of a git command on the bed's host (the script clears GIT_* itself)."""
    return bed_environment(base=host_environment(transport), extra=dict(bed.env) if bed else None)


def run_git_script(
    bed: Bed, transport: Transport, argv: tuple[str, ...], timeout: float, stdout_limit: int
) -> CommandResult:
    """One of these git scripts on the bed's host, outside the engine (enrolment, escrow)."""
    return transport.run(
        argv,
        cwd="/",
        env=git_environment(transport, bed),
        timeout=timeout,
        stdout_limit=stdout_limit,
        stderr_limit=1 << 16,
    )


def read_git_baseline(bed: Bed, *, transport: Transport) -> GitBaseline:
    """Record the bed's git baseline now (at enrolment, escrow, upgrade or clone); raises
    ContractViolation when its repository cannot be read."""
    found = parse_record(
        run_git_script(bed, transport, record_argv(bed.approot), GIT_TIMEOUT, RECORD_LIMIT)
    )
    if isinstance(found, str):
        raise ContractViolation(
            f"bed {bed.name}: cannot read its git repository at {bed.approot}/.git: {found}",
            fix="repair the bed's git repository (APG's set-up: git init, add, commit), then "
            "escrow it again",
        )
    return found


def clean_failure(stdout: str) -> str:
    """The reason the clean-up printed (its FARM_GIT_FAIL line), bounded."""
    for line in stdout.splitlines():
        if line.startswith("FARM_GIT_FAIL "):
            return line[len("FARM_GIT_FAIL ") :][:400]
    return ""


def clean_actions(stdout: str) -> list[str]:
    """What the clean-up did, one phrase per line it printed (`removed .git/refs/heads/x`)."""
    return [
        line[len("FARM_GIT ") :][:300]
        for line in stdout.splitlines()
        if line.startswith("FARM_GIT ") and line != "FARM_GIT clean"
    ]
