"""Nomad's constraint and affinity operators as pure functions of (operator, left value, right value).

Two evaluators, because Nomad has two (``scheduler/feasible/feasible.go``):

- :func:`check_attribute` is ``checkAttributeConstraint``: device
  constraints and affinities, whose sides are typed attributes
  (:class:`~nomad_plugin.nomad_view.types.Attribute`; a literal is read with
  :func:`~nomad_plugin.jobspec.units.parse_attribute`). ``None`` is a side
  that was not found.
- :func:`check_string` is ``checkConstraint``: job, group and task
  constraints and affinities on node values (``${attr.*}``, ``${meta.*}``,
  ``${node.*}``), whose sides are strings. ``None`` is a value the node does
  not have (Nomad then holds ``""`` and "not found").

Both return an :class:`Outcome`: whether it holds, and the words a job
author needs when it does not (or when Nomad's arithmetic, not the values'
plain meaning, decided it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nomad_plugin.jobspec import goversion, regex
from nomad_plugin.jobspec.golang import parse_float, parse_int, trim_space
from nomad_plugin.jobspec.units import compare, kind, render
from nomad_plugin.nomad_view.types import Attribute

EQUAL = ("=", "==", "is")
NOT_EQUAL = ("!=", "not")
ORDER = ("<", "<=", ">", ">=")
SET_ALL = ("set_contains", "set_contains_all")
NOT_HANDLED = ("distinct_hosts", "distinct_property")  # node-set constraints: other iterators decide them
OPERATORS = (
    *EQUAL, *NOT_EQUAL, *ORDER, "version", "semver", "regexp", *SET_ALL, "set_contains_any", "is_set", "is_not_set",
)  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    holds: bool
    why: str = ""  # why it does not hold when the values' meaning alone would not say (types, units, parsing)
    note: str = ""  # Nomad's arithmetic decided this, not the values' plain meaning
    panic: str = ""  # Nomad's scheduler panics evaluating it: the evaluation fails, nothing is placed

    def __bool__(self) -> bool:
        return self.holds


def _from_order(operator: str, order: int) -> bool:
    """checkAttributeConstraint's reading of Compare's -1/0/1 (bools give only 0 and 1)."""
    return {
        "=": order == 0, "==": order == 0, "is": order == 0, "!=": order != 0, "not": order != 0,
        "<": order == -1, "<=": order != 1, ">": order == 1, ">=": order != -1,
    }[operator]  # fmt: skip


def _article(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _string_of(attr: Attribute) -> str | None:
    return attr.value if isinstance(attr.value, str) else None


def set_contains_all(left: str, right: str) -> bool:
    """Every comma-separated item of ``right`` is one of ``left``'s (items trimmed of white space)."""
    have = {trim_space(item) for item in left.split(",")}
    return all(trim_space(item) in have for item in right.split(","))


def set_contains_any(left: str, right: str) -> bool:
    have = {trim_space(item) for item in left.split(",")}
    return any(trim_space(item) in have for item in right.split(","))


def check_version(version_text: str, constraint_text: str, semver: bool) -> Outcome:
    """``checkVersionMatch``: the version read loosely, the constraint by go-version or Nomad's semver."""
    version = goversion.parse_version(version_text)
    if version is None:
        return Outcome(False, f"{version_text!r} is not a version go-version reads")
    parsed = goversion.parse_constraints(constraint_text, semver=semver)
    if isinstance(parsed, str):
        return Outcome(False, f"{constraint_text!r} is not a {'semver' if semver else 'version'} constraint: {parsed}")
    return Outcome(parsed.check(version))


def check_regexp(text: str, pattern: str) -> Outcome:
    found = regex.search(pattern, text)
    if found is None:
        return Outcome(False, f"{pattern!r} is not a regular expression Go accepts: {regex.compile_error(pattern)}")
    return Outcome(found)


def check_attribute(operator: str, left: Attribute | None, right: Attribute | None) -> Outcome:
    """``checkAttributeConstraint``: ``left <operator> right`` for device attributes (None: not found)."""
    if operator in NOT_HANDLED:
        return Outcome(True)
    if operator == "is_set":
        return Outcome(left is not None)
    if operator == "is_not_set":
        return Outcome(left is None)
    if operator not in OPERATORS:
        return Outcome(False, f"unknown operator {operator!r}")
    if operator in NOT_EQUAL and (left is None) != (right is None):
        return Outcome(True)  # one side missing: "nil != some"
    if left is None or right is None:
        return Outcome(False, "not found")
    if operator in EQUAL or operator in NOT_EQUAL or operator in ORDER:
        comparison = compare(left, right)
        if comparison.panic:
            return Outcome(False, comparison.panic, panic=comparison.panic)
        if comparison.order is None:
            return Outcome(False, comparison.why)
        holds = _from_order(operator, comparison.order)
        note = ""
        if comparison.exact is not None and _from_order(operator, comparison.exact) != holds:
            how = comparison.detail or "Nomad compares them as 256-bit binary floats in the base unit"
            note = f"{how}; with exact arithmetic this would {'fail' if holds else 'hold'}"
        if isinstance(left.value, bool) and operator in ORDER:
            note = note or "bools have no order in Nomad: only >= always holds, <= and > mean equal and unequal"
        return Outcome(holds, note=note)
    if operator in ("version", "semver"):
        if isinstance(left.value, str):
            version_text = left.value
        elif isinstance(left.value, int) and not isinstance(left.value, bool):
            version_text = str(left.value)  # Nomad formats an integer attribute and reads it as a version
        else:
            return Outcome(
                False, f"{operator} needs a string or an integer, not {_article(kind(left))} ({render(left)})"
            )
        constraint_text = _string_of(right)
        if constraint_text is None:
            return Outcome(
                False,
                f"{operator} needs a string constraint: Nomad reads {render(right)} as {_article(kind(right))} "
                f'(write an operator, e.g. "= {render(right)}" or ">= {render(right)}")',
            )
        return check_version(version_text, constraint_text, operator == "semver")
    ls, rs = _string_of(left), _string_of(right)
    if ls is None or rs is None:
        side = right if rs is None else left
        return Outcome(
            False,
            f"{operator} compares strings only: Nomad reads {render(side)} as {_article(kind(side))}",
        )
    if operator == "regexp":
        return check_regexp(ls, rs)
    if operator in SET_ALL:
        return Outcome(set_contains_all(ls, rs))
    return Outcome(set_contains_any(ls, rs))


def _ordered(operator: str, order: int) -> bool:
    return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}[operator]


def _order_strings(operator: str, left: str, right: str) -> bool:
    """``checkOrder``: as int64 when both parse, else as float64 when both parse, else lexically."""
    li, ri = parse_int(left), parse_int(right)
    if li is not None and ri is not None:
        return _ordered(operator, (li > ri) - (li < ri))
    lf, rf = parse_float(left), parse_float(right)
    if lf is not None and rf is not None:
        if math.isnan(lf) or math.isnan(rf):
            return False  # every comparison with NaN is false in Go
        return _ordered(operator, (lf > rf) - (lf < rf))
    return _ordered(operator, (left > right) - (left < right))


def check_string(operator: str, left: str | int | None, right: str | int | None) -> Outcome:
    """``checkConstraint``: ``left <operator> right`` for node values (None: not found).

    An ``int`` side stands for a Go integer, which Nomad's tests pass: ``version`` formats it, the
    other operators refuse it.
    """
    if operator in NOT_HANDLED:
        return Outcome(True)
    if operator == "is_set":
        return Outcome(left is not None)
    if operator == "is_not_set":
        return Outcome(left is None)
    if operator not in OPERATORS:
        return Outcome(False, f"unknown operator {operator!r}")
    if operator in NOT_EQUAL:
        lv, rv = ("" if left is None else left), ("" if right is None else right)
        return Outcome(type(lv) is not type(rv) or lv != rv)
    if left is None or right is None:
        return Outcome(False, "not found")
    if operator in EQUAL:
        return Outcome(type(left) is type(right) and left == right)
    if operator in ("version", "semver"):
        if not isinstance(right, str):
            return Outcome(False, f"{operator} needs a string constraint")
        return check_version(str(left), right, operator == "semver")
    if not isinstance(left, str) or not isinstance(right, str):
        return Outcome(False, f"{operator} compares strings only")
    if operator in ORDER:
        return Outcome(_order_strings(operator, left, right))
    if operator == "regexp":
        return check_regexp(left, right)
    if operator in SET_ALL:
        return Outcome(set_contains_all(left, right))
    return Outcome(set_contains_any(left, right))
