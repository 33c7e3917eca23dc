"""Architecture guards: the pure core stays pure, drivers stay in their stores, the public API is pinned."""

from __future__ import annotations

import ast
from pathlib import Path

import runifold

PACKAGE = Path(runifold.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_history_is_pure() -> None:
    """history/ imports no store, worker, DSL, asyncio, clock, randomness or I/O library."""
    forbidden = ("runifold.stores", "runifold.worker", "runifold.dsl", "runifold.cli", "asyncio", "time",
                 "random", "aiosqlite", "asyncpg", "sqlite3", "os", "socket")
    for path in (PACKAGE / "history").glob("*.py"):
        for module in imported_modules(path):
            assert not module.startswith(forbidden), f"{path.name} imports {module}"


def test_database_drivers_stay_in_their_store() -> None:
    """Only the PostgreSQL store (stores/postgres.py and its connection pool) imports asyncpg; the SQLite store drives
    stdlib sqlite3 from its own threads."""
    for path in PACKAGE.rglob("*.py"):
        modules = imported_modules(path)
        assert "aiosqlite" not in modules, path
        if "asyncpg" in modules:
            assert path in (PACKAGE / "stores" / "postgres.py", PACKAGE / "stores" / "_pg_pool.py"), path


def test_dsl_does_not_depend_on_workers_or_stores() -> None:
    """Arrows point one way: dsl/ uses neither worker/ nor stores/."""
    for path in (PACKAGE / "dsl").glob("*.py"):
        for module in imported_modules(path):
            assert not module.startswith(("runifold.worker", "runifold.stores")), f"{path.name} imports {module}"


def test_public_api_is_pinned() -> None:
    """runifold.__all__ is exactly the documented public API."""
    assert sorted(runifold.__all__) == sorted([
        "Authenticator", "Budget", "BudgetExceededError", "CapabilityDeniedError", "CapabilitySet", "Checkpoint", "ChildFailedError", "ChildHandle", "Client", "Completed",
        "ConcurrencyLimit", "ConfigurationError", "DefinitionUnavailable", "EffectFailedError", "EffectOutcomeUnknown",
        "EnqueueConflictError", "Evidence", "Failed", "HmacKeyRing", "Idle", "InvalidInputError", "InvalidStateError",
        "LeaseDuration", "LeaseLost", "LeaseLostError", "NondeterminismError", "Outcome", "OutsideWorkflowError", "Phase",
        "RegistrationError", "ReplayReport", "Resolution", "ResumePolicy", "Retried", "RetryPolicy", "RunFailedError", "RunFailure", "RunHandle", "RunInfo",
        "RunNotFoundError", "RunStatus", "RunifoldError", "Schedule", "ScheduleInfo", "ScheduleNotFoundError",
        "SerializationError", "SignalConflictError", "SignalEnvelope", "SignalGateway", "SignalLimits", "SignalReceipt", "SignalRejectedError",
        "StepFailedError", "StoreError", "StoreUnavailableError", "Supervisor", "SuspendReason", "Suspended",
        "UnknownWorkflowError", "Usage", "WaitTimeoutError", "WorkerId", "WorkflowContext",
        "WorkflowDefinition", "WorkflowError", "WorkflowRegistry", "WorkflowStore", "WorkflowTask",
        "WorkflowWorker", "cancel_run", "check_compatibility", "compatibility_reports", "connect", "effect", "open_store", "replay_run", "resolve_effect", "retry_run", "sign", "step", "workflow",
    ])
    for name in runifold.__all__:
        assert hasattr(runifold, name), name


def test_the_testing_kit_needs_no_pytest() -> None:
    """runifold.testing (WorkflowEnvironment, FakeClock) imports without pytest; only the conformance suite needs it."""
    import subprocess
    import sys

    code = "import sys, runifold.testing; assert 'pytest' not in sys.modules; runifold.testing.WorkflowEnvironment"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
