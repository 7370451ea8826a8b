"""Checks: feasibility rules on a Plan (:mod:`.feasibility`), known upstream bugs on a config (:mod:`.known_issues`,
in the trigger language of :mod:`.conditions`), and a config's distributed timeouts against the cost model's waits
(:mod:`.timeouts`, imported directly: it reads :mod:`lcmoe_recipes.cost`, which imports this package)."""

from .feasibility import Finding, check_plan, raise_for_errors
from .known_issues import config_view, known_issue_findings, stack_versions

__all__ = ["Finding", "check_plan", "raise_for_errors", "config_view", "known_issue_findings", "stack_versions"]
