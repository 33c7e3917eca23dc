"""How users write workflows: decorators, context and definitions."""

from runifold.dsl._concurrency import ConcurrencyLimit
from runifold.dsl._context import ChildHandle, WorkflowContext
from runifold.dsl._decorators import EffectOutcomeUnknown, effect, step, workflow
from runifold.dsl._definition import (
    Budget,
    CapabilitySet,
    EffectSpec,
    Evidence,
    ResumePolicy,
    RetryPolicy,
    StepSpec,
    WorkflowDefinition,
    WorkflowSpec,
)

__all__ = [
    "Budget", "CapabilitySet", "ChildHandle", "ConcurrencyLimit", "EffectOutcomeUnknown", "EffectSpec", "Evidence",
    "ResumePolicy",
    "RetryPolicy", "StepSpec", "WorkflowContext", "WorkflowDefinition", "WorkflowSpec",
    "effect", "step", "workflow",
]
