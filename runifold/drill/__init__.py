"""The recovery drill: ``runifold drill --store URL`` (see docs/recovery-drill.md)."""

from runifold.drill._runner import DrillReport, DrillStep, run_drill

__all__ = ["DrillReport", "DrillStep", "run_drill"]
