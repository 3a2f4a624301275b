"""Constants gathered in one place, each with the reason for its value. The retry policy's
numbers (leases, back-offs, retries, hand-backs, quarantine in a row) are contract/retries.py's
RetryPolicy, not here."""

from __future__ import annotations

#: Seconds Store.retrying keeps at a transaction through a store that cannot be reached (a
#: PostgreSQL restart or a short stop): under a lease, so a claim held through the outage is
#: still this worker's when the store comes back.
STORE_PATIENCE = 40.0
#: Bytes of stdout/stderr kept per phase (head + tail); enough for every token and the DDEV exit line.
PHASE_OUTPUT_LIMIT = 256 * 1024
#: Bytes of grade stdout kept whole; an envelope past this is INVALID (too large), never cut.
GRADE_STDOUT_LIMIT = 2 * 1024 * 1024
#: Bytes of a run.json the farm will read.
RUN_JSON_LIMIT = 1024 * 1024
#: Seconds between polls of the store by an idle embedded bed thread.
IDLE_POLL_SECONDS = 0.2
#: The fixture set APG uses when none is named.
DEFAULT_FIXTURES = ("kb_docs", "canvas_home")
#: Where APG keeps baselines and runs, relative to the approot, unless AI_PG_BASELINE_DIR says otherwise.
BASELINE_DIR = ".ai-proving-ground"
#: Bytes of a sweep file the farm reads: 8 MiB holds some 400,000 task ids of 15 characters and
#: parses in about 3 s of CPU (docs/benchmarks.md); a bigger file is a generated mistake.
SWEEP_FILE_LIMIT = 8 * 1024 * 1024
#: Attempts (tasks × models × trials) a submit or run takes unless `--max-attempts` raises it: at
#: minutes of a bed each, a million is years of bed time; 10⁹ is a typo, not a plan.
MAX_ATTEMPTS = 1_000_000
#: The highest `--max-attempts`: a submit writes about 33,000 attempts a second and holds them in
#: one transaction (10⁶ took 30 s and 220 MB), so ten million is the most one submit can carry.
MAX_ATTEMPTS_CEILING = 10_000_000
#: Attempts above which a submit or run asks first (`--yes`, or a prompt on a terminal).
CONFIRM_ATTEMPTS = 100_000
