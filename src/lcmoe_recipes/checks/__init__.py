"""Checks: every finding. Feasibility rules on a Plan (:mod:`.feasibility`), the GPU and host memory findings
(:mod:`.memory`), all of a Plan's findings in one list (:mod:`.findings`), upstream asserts that fire late
(:mod:`.config_asserts`), known upstream bugs on a config (:mod:`.known_issues`, in the trigger language of
:mod:`.conditions`), settings legal but wrong for a real run (:mod:`.hygiene`), a config's distributed timeouts
against the cost model's waits (:mod:`.timeouts`), a phase's wall clock against its budget (:mod:`.wallclock`), and
the weights a run starts from (:mod:`.weights`). Nothing here imports torch or megatron."""

from .feasibility import Finding, check_plan, knob_findings, raise_for_errors
from .known_issues import config_view, known_issue_findings, stack_versions

__all__ = ["Finding", "check_plan", "knob_findings", "raise_for_errors", "config_view", "known_issue_findings",
           "stack_versions"]
