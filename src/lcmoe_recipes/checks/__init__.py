"""Feasibility checks: one module owns them (:mod:`.feasibility`)."""

from .feasibility import Finding, check_plan, raise_for_errors

__all__ = ["Finding", "check_plan", "raise_for_errors"]
