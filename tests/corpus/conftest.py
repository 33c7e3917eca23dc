"""The corpus runs in this process and in killed worker processes: it shares the crash tests' fixture."""

from tests.crash.conftest import crash_env

__all__ = ["crash_env"]
