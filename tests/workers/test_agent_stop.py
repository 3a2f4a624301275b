"""What the agent left in the web container is found from two process listings (real runs of it
on container beds are in tests/e2e/test_container_beds.py)."""

from __future__ import annotations

from apg_farm.workers.agent_stop import PS_ARGV, kill_argv, leftovers, read_ps

PS = " ".join(PS_ARGV)

BEFORE = """\
    1     0 /usr/bin/tini -- sleep infinity
    7     1 sleep infinity
   40     0 ps -e -o pid= -o ppid= -o args=
"""

AFTER = f"""\
    1     0 /usr/bin/tini -- sleep infinity
    7     1 sleep infinity
   52     1 python3 -c apg-sim-linger
   53    52 sleep 0.05
   60     0 bash -c {PS}
   61    60 {PS}
"""


def test_read_ps_skips_what_is_not_a_process_line() -> None:
    """Headers, blank and garbled lines are skipped; a process without arguments is kept."""
    found = read_ps("  PID  PPID COMMAND\n\n  9 1\nnot a line\n 10  9 x y z\n")
    assert found == {9: (1, ""), 10: (9, "x y z")}


def test_only_what_was_not_running_before_is_left_over() -> None:
    """New processes (and their children) are the agent's; PID 1, the processes of the
    listing before and the listing itself (and the shell DDEV wraps it in) are not."""
    baseline = read_ps(BEFORE)
    assert leftovers(baseline, read_ps(AFTER)) == [52, 53]
    assert leftovers(baseline, read_ps(BEFORE)) == []


def test_a_process_posing_as_the_listing_is_still_killed() -> None:
    """An agent process whose command line merely contains the ps words is not mistaken for it."""
    after = AFTER + f"   70     1 sh -c sleep 999 # {PS}\n"
    assert 70 in leftovers(read_ps(BEFORE), read_ps(after))


def test_kill_argv_is_safe_words() -> None:
    assert kill_argv([52, 53]) == ("kill", "-KILL", "52", "53")


def test_a_process_named_like_the_listing_is_caught_by_the_second_look() -> None:
    """An agent process renamed to the ps command line escapes one listing, not two."""
    posing = f"   80     1 {PS}\n"
    first, second = read_ps(BEFORE + posing), read_ps(BEFORE.replace("40", "41") + posing)
    assert leftovers(read_ps(BEFORE), first) == []
    assert leftovers(read_ps(BEFORE), second, earlier=first) == [80]
