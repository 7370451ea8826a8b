"""The trigger language of the known-issue catalogue: small declarative conditions over a config's dotted fields.

A condition is one of::

    {all: [C, ...]}   every C holds          {any: [C, ...]}   at least one C holds
    {not: C}          C does not hold        {ref: NAME}       the named condition NAME holds
    {field: PATH, op: OP, value: V}          the field at the dotted PATH compared with V
    {expr: "A * B / C", op: OP, value: V}    a product / quotient of fields and numbers compared with V

OP is one of ``== != < <= > >= in`` ``not in`` ``contains`` (V is in the field's string or list), ``truthy`` and
``falsy`` (no value). A field the config does not have is absent: only ``falsy`` holds for it (an ordering with
``None`` or with an incomparable value does not hold either). Enum members compare by their ``.value``. An ordering
of a list field holds when it holds for any element (``moe_aux_loss_coeff`` is a float or, with several
load-balancing types, a list of floats).

An ``expr`` is dotted paths and numbers joined by ``*`` and ``/`` (spaces around each operator), evaluated left to
right: ``train.micro_batch_size * model.seq_length / model.context_parallel_size``. It is absent when any of its
fields is absent or not a number, or a divisor is 0.

Fields are read from a :class:`ConfigView`: a megatron-bridge ``ConfigContainer`` through ``getattr``, or the dict
of its ``to_dict()`` / a YAML through item access, without importing megatron; ``X._target_`` of a config object is
its class path, as in the YAML. ``target.*`` are pseudo-fields describing the target GPU (``target.hardware``: the
hardware catalogue key; ``target.hbm_gb``: HBM per GPU in datasheet GB, 1e9 bytes; ``target.gpus``: world size;
``target.gpus_per_node``: GPUs per node).

Pure functions: nothing here imports torch or megatron, nothing is evaluated with ``eval``.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping

ABSENT = object()  # the value of a field the config does not have

_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
OPS = ("==", "!=", *_ORDER, "in", "not in", "contains", "truthy", "falsy")
_NO_VALUE = ("truthy", "falsy")


@dataclass(frozen=True)
class ConfigView:
    """Read-only dotted-path access to a config (object or dict) plus the target GPU's pseudo-fields.

    Attributes:
        config: a ConfigContainer, or the dict of ``ConfigContainer.to_dict()`` / a ConfigContainer YAML.
        target: pseudo-fields under ``target.`` (``hardware``, ``hbm_gb``, ``gpus``, ``gpus_per_node``); empty when the
            target is unknown.
    """

    config: Any
    target: Mapping[str, Any] = field(default_factory=dict)
    _read: dict = field(default_factory=dict, compare=False, repr=False)  # path -> value, read once per view

    def get(self, path: str) -> Any:
        """The value at the dotted ``path`` (e.g. ``model.context_parallel_size``), or :data:`ABSENT`; each path is
        read from the config once per view (a view stands for the config as it was when first read)."""
        try:
            return self._read[path]
        except KeyError:
            value = self._read[path] = self._lookup(path)
            return value

    def _lookup(self, path: str) -> Any:
        head, _, rest = path.partition(".")
        if head == "target":
            return self.target.get(rest, ABSENT)
        node = self.config
        for part in path.split("."):
            if node is None or node is ABSENT:
                return ABSENT
            if isinstance(node, Mapping):
                node = node.get(part, ABSENT)
            elif part == "_target_":
                node = f"{type(node).__module__}.{type(node).__qualname__}"
            else:
                node = getattr(node, part, ABSENT)
        return node


def _plain(value: Any) -> Any:
    """Enum members by value, sequences element-wise: how YAML and objects are compared alike."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_ARITH = {"*": operator.mul, "/": operator.truediv}


def _number(text: str, view: ConfigView) -> float | object:
    """A number literal, or the numeric value of the field at the dotted path ``text`` (else :data:`ABSENT`)."""
    try:
        return float(text)
    except ValueError:
        pass
    value = view.get(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ABSENT
    return value


def evaluate(expr: str, view: ConfigView) -> float | object:
    """The value of an ``expr`` (see the module doc), or :data:`ABSENT`."""
    parts = expr.split()
    total = _number(parts[0], view)
    for op, operand in zip(parts[1::2], parts[2::2]):
        value = _number(operand, view)
        if total is ABSENT or value is ABSENT or (op == "/" and value == 0):
            return ABSENT
        total = _ARITH[op](total, value)
    return total


def _expr_problems(expr: Any) -> list[str]:
    parts = expr.split() if isinstance(expr, str) else []
    if len(parts) % 2 == 0 or any(p not in _ARITH for p in parts[1::2]):
        return [f"expr must be operands joined by ' * ' or ' / ', not {expr!r}"]
    return []


def holds(condition: Mapping[str, Any], view: ConfigView, refs: Mapping[str, Any]) -> bool:
    """Whether ``condition`` holds for ``view``; ``refs`` maps names to conditions for ``{ref: NAME}``.

    Raises:
        ValueError: a malformed condition (see :func:`problems`); the catalogue is checked on load, so this means a
            catalogue entry that bypassed the check.
    """
    if "all" in condition:
        return all(holds(c, view, refs) for c in condition["all"])
    if "any" in condition:
        return any(holds(c, view, refs) for c in condition["any"])
    if "not" in condition:
        return not holds(condition["not"], view, refs)
    if "ref" in condition:
        return holds(refs[condition["ref"]], view, refs)
    op, want = condition["op"], condition.get("value")
    got = view.get(condition["field"]) if "field" in condition else evaluate(condition["expr"], view)
    if op == "falsy":
        return got is ABSENT or not got
    if got is ABSENT:
        return False
    got = _plain(got)
    if op == "truthy":
        return bool(got)
    if op == "==":
        return got == want
    if op == "!=":
        return got != want
    if op == "in":
        return got in want
    if op == "not in":
        return got not in want
    if op == "contains":
        return isinstance(got, (str, list)) and want in got
    if op in _ORDER:
        return any(_ordered(op, g, want) for g in got) if isinstance(got, list) else _ordered(op, got, want)
    raise ValueError(f"unknown op {op!r} in {condition}")


def _ordered(op: str, got: Any, want: Any) -> bool:
    try:
        return got is not None and not isinstance(got, bool) and _ORDER[op](got, want)
    except TypeError:
        return False


def problems(condition: Any, refs: Mapping[str, Any], where: str = "trigger") -> list[str]:
    """Every way ``condition`` is malformed (empty when it is well formed), each naming ``where`` it is."""
    if not isinstance(condition, Mapping):
        return [f"{where}: a condition must be a mapping, not {condition!r}"]
    kinds = [k for k in ("all", "any", "not", "ref", "field", "expr") if k in condition]
    if len(kinds) != 1:
        return [f"{where}: exactly one of all/any/not/ref/field/expr expected, got {sorted(condition)}"]
    kind = kinds[0]
    if kind in ("all", "any"):
        items = condition[kind]
        if not isinstance(items, list) or not items:
            return [f"{where}: '{kind}' needs a non-empty list"]
        return [p for i, c in enumerate(items) for p in problems(c, refs, f"{where}.{kind}[{i}]")]
    if kind == "not":
        return problems(condition["not"], refs, f"{where}.not")
    if kind == "ref":
        return [] if condition["ref"] in refs else [f"{where}: unknown condition name {condition['ref']!r}"]
    extra = set(condition) - {kind, "op", "value"}
    op = condition.get("op")
    found = [f"{where}: unknown keys {sorted(extra)}"] if extra else []
    if kind == "expr":
        found += [f"{where}: {p}" for p in _expr_problems(condition["expr"])]
    elif not isinstance(condition["field"], str) or not all(condition["field"].split(".")):
        found.append(f"{where}: field must be a dotted path, not {condition['field']!r}")
    if op not in OPS:
        found.append(f"{where}: op {op!r} is not one of {', '.join(OPS)}")
    elif op in _NO_VALUE and "value" in condition:
        found.append(f"{where}: op {op!r} takes no value")
    elif op not in _NO_VALUE and "value" not in condition:
        found.append(f"{where}: op {op!r} needs a value")
    elif op in ("in", "not in") and not isinstance(condition["value"], list):
        found.append(f"{where}: op {op!r} needs a list value")
    elif op in _ORDER and not isinstance(condition["value"], (int, float)):
        found.append(f"{where}: op {op!r} needs a number")
    return found


def describe(condition: Mapping[str, Any]) -> str:
    """``condition`` as one line of text, e.g. ``model.pipeline_model_parallel_size > 1 and variable_seq_lengths``."""
    if "all" in condition or "any" in condition:
        kind = "all" if "all" in condition else "any"
        parts = [describe(c) for c in condition[kind]]
        parts = [f"({p})" if (" and " in p or " or " in p) else p for p in parts]
        return f" {'and' if kind == 'all' else 'or'} ".join(parts)
    if "not" in condition:
        return f"not ({describe(condition['not'])})"
    if "ref" in condition:
        return condition["ref"]
    op, path = condition["op"], condition.get("field") or f"({condition['expr']})"
    if op == "truthy":
        return f"{path} is set"
    if op == "falsy":
        return f"{path} is unset or false"
    value = condition["value"]
    shown = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list) else str(value)
    return f"{path} {op} {shown}"
