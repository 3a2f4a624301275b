"""`python -m apg_farm` is `apg-farm`; `run` is the entry point of both."""

from __future__ import annotations

import sys


def run() -> None:
    """Move the farm's secrets out of reach of bed commands (a re-exec, secret_env.py), then run
    the command. The CLI is imported after the re-exec, so only the second image pays for it."""
    from apg_farm.errors import FarmError
    from apg_farm.secret_env import protect

    try:
        protect()
    except FarmError as error:
        sys.stderr.write(f"error: {error.render()}\n")
        sys.exit(error.exit_code)
    from apg_farm.cli import main

    main()


if __name__ == "__main__":
    run()
