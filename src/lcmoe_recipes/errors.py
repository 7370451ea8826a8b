"""Typed errors for user input (each names the bad value and the fix; the commands turn them into exit code 2), and
the :class:`Finding` every check returns."""

from __future__ import annotations

from dataclasses import dataclass


class LcmoeError(ValueError):
    """A request, plan, config or override that cannot be honoured.

    Attributes:
        message: what is wrong, naming the bad value(s).
        fix: what to do instead (a valid alternative), or "" where the message already says it.
        fields: the :class:`~lcmoe_recipes.core.request.TrainingRequest` fields the message and fix name (e.g.
            ``("seq_length",)``): a library error speaks in fields; each command line shows them as its flags
            (:func:`lcmoe_recipes.cli.common.as_flags`).
    """

    exit_code = 2

    def __init__(self, message: str, fix: str = "", fields: tuple[str, ...] = ()) -> None:
        self.message, self.fix, self.fields = message, fix, tuple(fields)
        super().__init__(f"{message}{'; ' + fix if fix else ''}")


class UnknownName(LcmoeError):
    """An unknown model, hardware, recipe or precision name."""


class ModelConfigError(LcmoeError):
    """A model config.json that cannot be used: missing, not JSON, not an object, a missing or bad key, or an
    architecture megatron-bridge cannot build (the fix lists those it can)."""


class InfeasibleConfig(LcmoeError):
    """A plan or ConfigContainer that breaks a rule (ours or Megatron's). ``findings`` holds every error found."""

    def __init__(self, message: str, fix: str = "", findings: list | None = None, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message, fix, fields)
        self.findings = list(findings or [])


class OverrideError(LcmoeError):
    """A Hydra override that cannot be applied (bad syntax, unknown key, wrong type)."""


class CalibrationError(LcmoeError):
    """A training log or calibration profile that cannot be used (names the file, the line and the fix)."""


class LaunchError(LcmoeError):
    """A valid config that cannot start here (too few GPUs) or whose launch failed (sbatch refused it, the job
    failed). The CLI turns it into exit code 1: the YAML is written, the problem is the cluster or the run."""

    exit_code = 1


@dataclass(frozen=True)
class Finding:
    """One result of a check.

    Attributes:
        severity: "error" (the run cannot start or is wrong) or "warning" (legal but costly or surprising).
        rule: short identifier, e.g. ``divisibility/seq-cp``.
        message: what is wrong, naming the bad values.
        fix: what to do instead.
    """

    severity: str
    rule: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.severity}] {self.rule}: {self.message}; {self.fix}"


CONSEQUENCES = ("memory/", "host-memory/")
"""Rule prefixes of errors that follow from the rest of a config (its memory, priced from every other setting): an
error of another rule is its root cause where both occur, and leads."""


def raise_for_errors(findings: list[Finding], what: str = "plan") -> None:
    """Raise :class:`InfeasibleConfig` naming the first error (all findings attached) if any is an error; a root cause
    (any rule but the :data:`CONSEQUENCES`) leads over the memory it overflows."""
    errors = sorted((f for f in findings if f.severity == "error"), key=lambda f: f.rule.startswith(CONSEQUENCES))
    if errors:
        more = f" (and {len(errors) - 1} more: {'; '.join(e.rule for e in errors[1:])})" if len(errors) > 1 else ""
        ordered = [errors[0]] + [f for f in findings if f is not errors[0]]  # the headline first, as it is shown
        raise InfeasibleConfig(f"{what}: {errors[0].message}{more}", errors[0].fix, ordered)
