"""apg-farm's beds for Inspect AI (`pip install 'apg-farm[inspect]'`): the `apg` sandbox and
its scorer. docs/inspect.md says how to run an Inspect eval on the farm's beds."""

from apg_farm.inspect.config import ApgConfig
from apg_farm.inspect.logs import write_inspect_logs
from apg_farm.inspect.sandbox import ApgSandboxEnvironment
from apg_farm.inspect.scorer import apg_grade

__all__ = ["ApgConfig", "ApgSandboxEnvironment", "apg_grade", "write_inspect_logs"]
