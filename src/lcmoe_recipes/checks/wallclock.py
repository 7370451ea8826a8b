"""A training phase's predicted wall-clock time against the budget the user gives it (``launch --budget-hours``)."""

from __future__ import annotations

from ..core.plan import Plan
from ..cost.wallclock import DEFAULT_PHASE_BUDGET_HOURS, phase_time, tokens_per_step_for
from ..errors import Finding


def phase_findings(plan: Plan, budget_hours: float = DEFAULT_PHASE_BUDGET_HOURS) -> list[Finding]:
    """A warning (rule ``time/phase-long``) when ``plan``'s phase is predicted to run longer than ``budget_hours``,
    with the ``--tokens-per-step`` that fits it (or, when none does, the GPUs to add)."""
    time = phase_time(plan)
    if time.total <= budget_hours * 3600:
        return []
    fits = tokens_per_step_for(plan, budget_hours * 3600)
    message = (f"{plan.name}: {time.text()}, over a budget of {budget_hours:g} h at {plan.tokens_per_step / 1e6:.1f}M "
               "tokens per step")
    if fits:
        fix = (f"--tokens-per-step {fits} ({fits / 1e6:.1f}M) fits {budget_hours:g} h at this layout (fewer tokens "
               "trained); or fewer --train-iters, or more GPUs")
    else:
        fix = "more GPUs or fewer --train-iters: even the smallest batch this layout runs does not fit"
    return [Finding("warning", "time/phase-long", message, fix)]
