"""Checks: feasibility rules on a Plan (:mod:`.feasibility`) and known upstream bugs on a config (:mod:`.known_issues`,
in the trigger language of :mod:`.conditions`)."""

from .feasibility import Finding, check_plan, raise_for_errors
from .known_issues import config_view, known_issue_findings, stack_versions

__all__ = ["Finding", "check_plan", "raise_for_errors", "config_view", "known_issue_findings", "stack_versions"]
