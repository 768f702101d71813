"""Verdicts by rules stated before the result: yes / partly / no for each claim of the paper.

A notebook writes a claim's rule next to the claim, before any number is computed::

    RISES = Rule(yes="ratio >= 1.5 and spearman >= 0.7 and peak_position >= 2/3",
                 partly="ratio >= 1.2 and spearman >= 0.3")

and, once the measurement exists, turns it into a status row with :func:`claim`::

    claim("coupling rises over training", paper="2.4×, nearly monotonic", rule=RISES,
          values={"ratio": 1.93, "spearman": 0.29, "peak_position": 0.3}, ours="1.93×")

The verdict is computed from the rule and the values, never typed, and the row carries the rule's
text and the values it was judged on, so the status page shows why a claim got its verdict.
Rules are small expressions over named numbers: comparisons (``<``, ``<=``, ``>``, ``>=``, ``==``,
``!=``), ``and`` / ``or`` / ``not``, arithmetic (``+ - * /``, ``abs``) and number literals. A name
the values do not provide is an error; a NaN value makes every comparison it enters false, so a
missing number never earns a "yes".

A value may be an :class:`Interval` (an estimate with its confidence interval, e.g. from
:func:`coupling_utils.analysis.stats.bootstrap_ci`). Then "yes" needs the yes-condition to hold
over every interval (``x >= 0.05`` is a yes only when the interval's low end is at least 0.05;
each comparison is checked over the whole range its two sides take), while "partly" is judged on
the estimates: the partly-condition, or the yes-condition, met at the estimates. A number without
an interval counts as exact: it is its own interval and its own estimate. :attr:`Rule.text` says
all this in one line.

Shape claims ("rises", "nearly monotonic", "dense at the end") are judged on shape descriptors of
the whole curve (rank correlation with the step, where the peak lies, the largest drop), not on
two end points: see :func:`coupling_utils.analysis.emergence.growth_summary`.
"""

from __future__ import annotations

import ast
import html
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Rule",
    "RuleError",
    "Interval",
    "MIN_UNITS",
    "KINDS",
    "claim",
    "verdict_word",
    "VERDICT_CLASS",
    "assume",
    "ASSUMPTION_KEY",
]

KINDS = ("measured", "replot")
"""``measured``: this book's own measurement; ``replot``: the paper's own (digitised) points redrawn."""

_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SYMBOLS = {"<=": "≤", ">=": "≥", "!=": "≠"}


class RuleError(ValueError):
    """A rule that cannot be read or evaluated; the message names the rule and the fix."""


MIN_UNITS = 6
"""The fewest units (prompts, images, models, windows ...) a 95% interval is resampled from. Of n
units drawn at random, the lowest and highest both miss their population's median with probability
2·2⁻ⁿ: 6.25% for 5 units, 3.1% for 6. A percentile bootstrap interval lies within the units' range,
so from fewer than 6 units it cannot be a 95% interval (from 2, it is just their two values)."""


@dataclass(frozen=True)
class Interval:
    """A number with its confidence interval: ``estimate`` in ``[low, high]`` at ``level``,
    resampled ``over`` something (prompts, models, seeds, pairs ...) of which there are ``units``
    (default: the number ``over`` starts with, as in "12 prompts"). An interval resampled from
    fewer than :data:`MIN_UNITS` units is no 95% interval: its bounds are made unbounded, as one
    unit's are, so no rule reads a "yes" from it and its words say why."""

    estimate: float
    low: float
    high: float
    level: float = 0.95
    over: str = ""
    units: int | None = None

    def __post_init__(self):
        lo, est, hi = (float(v) for v in (self.low, self.estimate, self.high))
        if not any(math.isnan(v) for v in (lo, est, hi)) and not lo <= est <= hi:
            raise RuleError(
                f"an interval needs low <= estimate <= high, got [{lo:.4g}, {hi:.4g}] around {est:.4g}; "
                "pass the bootstrap's percentile interval of the same statistic"
            )
        if not 0 < float(self.level) < 1:
            raise RuleError(f"an interval's level must lie in (0, 1), got {self.level!r}")
        if self.units is None:
            counted = re.match(r"\s*(\d+)\b", str(self.over))
            object.__setattr__(self, "units", int(counted.group(1)) if counted else None)
        if self.units is not None and self.units < MIN_UNITS and not math.isnan(est):
            object.__setattr__(self, "low", -math.inf)  # too few to resample: no interval at all
            object.__setattr__(self, "high", math.inf)

    @classmethod
    def from_bootstrap(cls, row: Mapping[str, Any], over: str = "") -> Interval:
        """From a row of :func:`coupling_utils.analysis.stats.bootstrap_ci`."""
        est = float(row["estimate"])  # a percentile interval may miss a skewed estimate: widen to it
        low, high = min(float(row["ci_low"]), est), max(float(row["ci_high"]), est)
        return cls(est, low, high, float(row["level"]), over)

    @property
    def resampled(self) -> bool:
        """Whether there is an interval: False when too few units were there to resample (fewer than
        :data:`MIN_UNITS` prompts, windows ...): the bounds are then unbounded and no rule can give a
        "yes"."""
        return math.isfinite(float(self.low)) and math.isfinite(float(self.high))

    def words(self, spec: str = ".2f") -> str:
        """The interval as prose says it ("95% interval 0.80 to 0.88 over 12 prompts"), or why there is
        none ("no 95% interval: only 1 prompt, nothing to resample"; "… only 2 prompts (K = 3–72),
        too few to resample (a 95% interval needs at least 6)"); the status tables' brackets
        (``str``) say the same."""
        over = f" over {self.over}" if self.over else ""
        if not self.resampled:
            if not self.over:
                return f"no {self.level:.0%} interval: too few units to resample"
            if self.units is not None and self.units > 1:
                need = f"a {self.level:.0%} interval needs at least {MIN_UNITS}"
                return f"no {self.level:.0%} interval: {self._only()}, too few to resample ({need})"
            return f"no {self.level:.0%} interval: {self._only()}, nothing to resample"
        return f"{self.level:.0%} interval {self.low:{spec}} to {self.high:{spec}}{over}"

    def _only(self) -> str:
        """The units there were, for words of why there is no interval: "only 2 prompts", with
        ``over``'s detail in brackets ("only 2 prompts (K = 3–72)") and a count given apart from
        ``over`` put before it ("only 3 members")."""
        head, _, detail = str(self.over).partition(", ")
        if self.units is not None and not re.match(r"\s*\d+\b", head):
            head = f"{self.units} {head}"
        return f"only {head}" + (f" ({detail})" if detail else "")

    def bracketed(self, spec: str = ".2f") -> str:
        """The bounds in brackets for a table cell ("[0.40, 0.60]"), or the words of why there are
        none ("[no 95% interval: only 2 prompts, …]"): never "[-inf, inf]"."""
        return f"[{self.low:{spec}}, {self.high:{spec}}]" if self.resampled else f"[{self.words(spec)}]"

    def __str__(self) -> str:
        if not self.resampled:
            return f"{_fmt(self.estimate)} [{self.words()}]"
        over = f" over {self.over}" if self.over else ""
        estimate, low, high = _told_apart(self.estimate, self.low, self.high)
        return f"{estimate} [{low}, {high}; {self.level:.0%}{over}]"


def _names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id != "abs"}


def _parse(expr: str, where: str) -> ast.Expression:
    if not isinstance(expr, str) or not expr.strip():
        raise RuleError(f"{where} must be a non-empty expression such as 'ratio >= 1.5', got {expr!r}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise RuleError(f"{where} {expr!r} is not a valid expression: {exc.msg}") from exc
    allowed = (
        ast.Expression,
        ast.BoolOp,
        ast.And,
        ast.Or,
        ast.UnaryOp,
        ast.Not,
        ast.USub,
        ast.UAdd,
        ast.Compare,
        ast.BinOp,
        ast.Name,
        ast.Load,
        ast.Constant,
        ast.Call,
        *_COMPARE,
        *_ARITH,
    )
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise RuleError(
                f"{where} {expr!r} uses {type(node).__name__}; rules may only use comparisons, "
                "and/or/not, + - * /, abs() and numbers"
            )
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name)
            and node.func.id == "abs"
            and len(node.args) == 1
            and not node.keywords
        ):
            raise RuleError(f"{where} {expr!r}: the only function a rule may call is abs(x)")
        if isinstance(node, ast.Constant) and (
            isinstance(node.value, bool) or not isinstance(node.value, (int, float))
        ):
            raise RuleError(f"{where} {expr!r}: literals must be numbers, got {node.value!r}")
    return tree


def _eval(node: ast.AST, values: Mapping[str, float]) -> Any:
    """The expression's value on point numbers (a comparison gives a bool)."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, values)
    if isinstance(node, ast.BoolOp):
        parts = [bool(_eval(v, values)) for v in node.values]
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not bool(v)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values)
            if not _COMPARE[type(op)](left, right):  # NaN compares false
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, values), _eval(node.right, values)
        if isinstance(node.op, ast.Div) and b == 0:
            return math.nan
        return _ARITH[type(node.op)](a, b)
    if isinstance(node, ast.Call):
        return abs(_eval(node.args[0], values))
    if isinstance(node, ast.Name):
        return values[node.id]
    return node.value  # a number (checked by _parse)


_NAN_RANGE = (math.nan, math.nan)


def _range(node: ast.AST, bounds: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    """The range ``(low, high)`` an arithmetic expression takes over the values' intervals."""
    if isinstance(node, ast.Name):
        return bounds[node.id]
    if isinstance(node, ast.Constant):
        return (float(node.value), float(node.value))
    if isinstance(node, ast.UnaryOp):
        lo, hi = _range(node.operand, bounds)
        return (-hi, -lo) if isinstance(node.op, ast.USub) else (lo, hi)
    if isinstance(node, ast.Call):  # abs
        lo, hi = _range(node.args[0], bounds)
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
    if isinstance(node, ast.BinOp):
        (a, b), (c, d) = _range(node.left, bounds), _range(node.right, bounds)
        if isinstance(node.op, ast.Add):
            return (a + c, b + d)
        if isinstance(node.op, ast.Sub):
            return (a - d, b - c)
        if isinstance(node.op, ast.Div):
            if c <= 0 <= d:
                return _NAN_RANGE
            c, d = 1 / d, 1 / c
        corners = [a * c, a * d, b * c, b * d]
        return _NAN_RANGE if any(math.isnan(v) for v in corners) else (min(corners), max(corners))
    raise RuleError(f"a {type(node).__name__} cannot stand where a number is expected in a rule")


def _surely(node: ast.AST, bounds: Mapping[str, tuple[float, float]], want: bool = True) -> bool:
    """Whether the condition is ``want`` for every point of the values' intervals."""
    if isinstance(node, ast.Expression):
        return _surely(node.body, bounds, want)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _surely(node.operand, bounds, not want)
    if isinstance(node, ast.BoolOp):
        parts = [_surely(v, bounds, want) for v in node.values]
        every = isinstance(node.op, ast.And) == want  # and-true / or-false: every part
        return all(parts) if every else any(parts)
    if isinstance(node, ast.Compare):
        pairs, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            pairs.append((op, _range(left, bounds), _range(right, bounds)))
            left = right
        held = [_holds_everywhere(op, a, b, want) for op, a, b in pairs]
        return all(held) if want else any(held)
    raise RuleError(f"a {type(node).__name__} cannot stand where a condition is expected in a rule")


def _holds_everywhere(op: ast.cmpop, a: tuple[float, float], b: tuple[float, float], want: bool) -> bool:
    """``a op b`` (want True) or its negation (want False) for all points of two ranges."""
    if any(math.isnan(v) for v in (*a, *b)):
        return not want  # NaN compares false: surely not, never surely so
    (a_lo, a_hi), (b_lo, b_hi) = a, b
    kind = type(op)
    if not want:
        kind = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt,
                ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}[kind]  # fmt: skip
    if kind is ast.Lt:
        return a_hi < b_lo
    if kind is ast.LtE:
        return a_hi <= b_lo
    if kind is ast.Gt:
        return a_lo > b_hi
    if kind is ast.GtE:
        return a_lo >= b_hi
    if kind is ast.Eq:
        return a_lo == a_hi == b_lo == b_hi
    return a_hi < b_lo or b_hi < a_lo  # NotEq


_FLIPPED = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq}


def _conjuncts(node: ast.AST) -> list[ast.AST]:
    """The parts of a condition joined by ``and`` at its top (the condition itself if none)."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [part for value in node.values for part in _conjuncts(value)]
    return [node]


def _box(conditions: list[ast.AST]) -> dict[str, tuple[float, float]]:
    """The closed range each expression compared with a number in ``conditions`` (``x >= 0.5``,
    ``abs(r2 - 0.8) <= 0.02``) is held to by all of them together, keyed by its ``ast.dump``."""
    box: dict[str, tuple[float, float]] = {}
    for c in conditions:
        if not (isinstance(c, ast.Compare) and len(c.ops) == 1 and type(c.ops[0]) in _FLIPPED):
            continue
        expr, number, kind = c.left, c.comparators[0], type(c.ops[0])
        if not _names(expr):
            expr, number, kind = number, expr, _FLIPPED[kind]
        if _names(number):
            continue
        value, key = float(_eval(number, {})), ast.dump(expr)
        lo, hi = box.get(key, (-math.inf, math.inf))
        lo = max(lo, value) if kind in (ast.Gt, ast.GtE, ast.Eq) else lo
        hi = min(hi, value) if kind in (ast.Lt, ast.LtE, ast.Eq) else hi
        box[key] = (lo, hi)
    return box


def _implied(node: ast.AST, given: list[ast.AST], box: Mapping[str, tuple[float, float]]) -> bool:
    """Whether ``node`` surely holds wherever every condition of ``given`` does (``box``: their
    :func:`_box`); False where that cannot be told from the conditions' form alone."""
    if ast.dump(node) in {ast.dump(g) for g in given}:
        return True
    if isinstance(node, ast.BoolOp):
        parts = [_implied(v, given, box) for v in node.values]
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return False
    sides = []
    for side in (node.left, node.comparators[0]):
        value = None if _names(side) else float(_eval(side, {}))
        sides.append((value, value) if value is not None else box.get(ast.dump(side)))
    return None not in sides and _holds_everywhere(node.ops[0], sides[0], sides[1], True)


def _pretty(expr: str) -> str:
    text = " ".join(expr.split())
    for a, b in _SYMBOLS.items():
        text = text.replace(a, b)
    return text


@dataclass(frozen=True)
class Rule:
    """When a claim is reproduced: ``yes`` and ``partly`` conditions over named numbers.

    ``partly`` is optional (None: the verdict is yes or no). A rule is checked when it is made,
    so a typo fails before any measurement runs.
    """

    yes: str
    partly: str | None = None

    def __post_init__(self):
        _parse(self.yes, "Rule(yes=...)")
        if self.partly is not None:
            _parse(self.partly, "Rule(partly=...)")

    @property
    def names(self) -> set[str]:
        """The values the rule needs."""
        names = _names(_parse(self.yes, "yes"))
        return names | (_names(_parse(self.partly, "partly")) if self.partly else set())

    @property
    def text(self) -> str:
        """The rule as :meth:`judge` reads it, in one line for the status page: ``yes if … over
        every interval; partly if … at the estimates; otherwise no``. The partly clause names the
        yes-condition too (an estimate that meets it while its interval does not is a partly),
        unless the partly-condition surely holds wherever the yes-condition does."""
        yes = _pretty(self.yes)
        partly = _pretty(self.partly) if self.partly else yes
        given = _conjuncts(_parse(self.yes, "yes").body)
        if self.partly and not _implied(_parse(self.partly, "partly").body, given, _box(given)):
            partly += ", or the yes-condition,"
        return f"yes if {yes} over every interval; partly if {partly} at the estimates; otherwise no"

    @property
    def point_text(self) -> str:
        """The rule as :meth:`judge` reads plain numbers (no intervals, each its own estimate):
        ``yes if …; otherwise no``, with a partly clause only where a partly-condition differs
        from the yes-condition (with none, a number that meets the yes-condition is a yes)."""
        partly = f"; partly if {_pretty(self.partly)}" if self.partly and self.partly != self.yes else ""
        return f"yes if {_pretty(self.yes)}{partly}; otherwise no"

    def _points(self, values: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
        """``(estimates, bounds)`` of the values the rule names (a number is its own interval)."""
        missing = sorted(self.names - set(values))
        if missing:
            raise RuleError(
                f"the rule '{self.text}' needs {missing}, but the values give only {sorted(values)}; "
                "pass every number the rule names"
            )
        estimates, bounds = {}, {}
        for name in self.names:
            value = values[name]
            try:
                if isinstance(value, Interval):
                    estimates[name], bounds[name] = (
                        float(value.estimate),
                        (float(value.low), float(value.high)),
                    )
                else:
                    estimates[name] = float(value)
                    bounds[name] = (estimates[name], estimates[name])
            except (TypeError, ValueError) as exc:
                raise RuleError(f"value {name!r} = {value!r} is not a number") from exc
        return estimates, bounds

    def short_of_yes(self, values: Mapping[str, Any], spec: str = ".2f") -> str:
        """Why ``values`` are not a yes, in words: each part of the yes-condition (joined by ``and``
        at its top) that does not hold over the whole of its values' intervals, with those values:
        "walk_ratio ≤ 0.8 does not hold over its whole interval (walk_ratio 0.79, 95% interval 0.77
        to 0.82 over 6 prompts)", or "… holds at the estimate only" where too few units left no
        interval, or "… does not hold at the estimate"; "" where :meth:`judge` gives a yes."""
        estimates, bounds = self._points(values)
        short = []
        for part in _conjuncts(_parse(self.yes, "yes").body):
            if _eval(part, estimates) and _surely(part, bounds):
                continue
            shown = []
            for name in sorted(_names(part)):
                value = values[name]
                shown.append(
                    f"{name} {value.estimate:{spec}}, {value.words(spec)}"
                    if isinstance(value, Interval)
                    else f"{name} {float(value):{spec}}"
                )
            bare = [values[n] for n in _names(part) if isinstance(values[n], Interval)]
            unresampled = any(not v.resampled for v in bare)
            if not _eval(part, estimates):
                said = "does not hold at the estimate"
            elif unresampled:  # an interval of too few units: nothing for a yes to hold over
                said = "holds at the estimate only"
            else:
                said = "does not hold over its whole interval"
            text = ast.get_source_segment(self.yes.strip(), part) or ast.unparse(part)
            short.append(f"{_pretty(text)} {said} ({'; '.join(shown)})")
        return "; ".join(short)

    def judge(self, values: Mapping[str, Any]) -> str:
        """``"yes"``, ``"partly"`` or ``"no"`` for these values (numbers or :class:`Interval`, a
        number being its own interval and estimate): yes when the yes-condition holds over every
        interval; partly when the partly-condition, or the yes-condition, holds at the estimates."""
        estimates, bounds = self._points(values)
        if _eval(_parse(self.yes, "yes"), estimates) and _surely(_parse(self.yes, "yes"), bounds):
            return "yes"
        if self.partly and _eval(_parse(self.partly, "partly"), estimates):
            return "partly"
        if _eval(_parse(self.yes, "yes"), estimates):
            return "partly"  # the estimate passes, its interval does not clear the threshold
        return "no"


def _fmt(value: Any) -> str:
    if isinstance(value, Interval):
        return str(value)
    v = float(value)
    return "NaN" if math.isnan(v) else f"{v:.3g}"


def _told_apart(*values: float) -> list[str]:
    """``values`` to three significant digits, or to as many more (up to six) as it takes for
    values that differ to read differently: "1.083 [1.081, 1.084]", never "1.08 [1.08, 1.08]"."""
    for digits in range(3, 7):
        words = ["NaN" if math.isnan(v) else f"{v:.{digits}g}" for v in map(float, values)]
        if all(words[i] != words[j] for i in range(len(words)) for j in range(i) if values[i] != values[j]):
            break
    return words


def claim(
    claim: str,
    *,
    paper: Any,
    rule: Rule,
    values: Mapping[str, Any],
    ours: Any = None,
    note: str = "",
    kind: str = "measured",
) -> dict[str, Any]:
    """A reproduction-status row whose verdict is ``rule`` judged on ``values``.

    ``ours`` is what the row shows as this run's result (default: the values the rule names);
    the row's ``rule`` column holds the rule's text (:attr:`Rule.text`, which says how a verdict
    reads intervals) and the values it was judged on. ``kind`` is
    "measured" (this book's measurement) or "replot" (the paper's own points redrawn), which the
    status page keeps apart. Pass the rows to :func:`coupling_utils.pipeline.status.report`.
    """
    if not isinstance(rule, Rule):
        raise RuleError(f"rule must be a Rule(yes=..., partly=...), got {type(rule).__name__}")
    if kind not in KINDS:
        raise RuleError(f"kind must be one of {KINDS}, got {kind!r}")
    agree = rule.judge(values)
    judged = ", ".join(f"{name} = {_fmt(values[name])}" for name in sorted(rule.names))
    if ours is None:
        ours = judged
    return {
        "claim": claim,
        "paper": paper,
        "ours": ours,
        "agree": agree,
        "rule": f"{rule.text} (judged on {judged})",
        "kind": kind,
        "note": note,
    }


VERDICT_CLASS = "coupling-verdict"
"""HTML class of a verdict word in the prose (:func:`verdict_word`); the book's proofreading
(``pipeline/proofread.py``) checks each against its page's status table."""


def verdict_word(row: Mapping[str, Any]):
    """A status row's verdict (``row["agree"]``, as :func:`claim` made it) for the prose: the word
    in bold, tagged with the row's claim so that the book's build fails when the prose and the
    page's status table disagree. Glue it with ``{glue:md}``; never type a verdict word."""
    from IPython.display import Markdown

    claim_text = html.escape(str(row["claim"]), quote=True)
    return Markdown(f'<span class="{VERDICT_CLASS}" data-claim="{claim_text}">**{row["agree"]}**</span>')


ASSUMPTION_KEY = "coupling_assumption"
"""Output-metadata key under which :func:`assume` stores ``{"key", "holds", "text"}``."""


def assume(key: str, holds: bool, text: str) -> bool:
    """Record that the prose next to this cell assumes ``text`` about this run's numbers.

    A sentence typed into a chapter that depends on the result ("the twin sits at chance
    level") is paired with the condition it assumes. When the condition holds, nothing shows;
    when a rerun breaks it, the page shows a warning naming the sentence's assumption, and the
    check on the executed default notebooks (``tests/test_default_book.py``, run by ``make book``)
    fails. The record is kept in the output's metadata (renderers ignore it).
    """
    from IPython.display import display

    if not isinstance(key, str) or not key.strip():
        raise RuleError(f"assume() needs a key naming the assumption, got {key!r}")
    holds = bool(holds)
    payload = {ASSUMPTION_KEY: {"key": key.strip(), "holds": holds, "text": str(text)}}
    if holds:
        display({"text/html": ""}, metadata=payload, raw=True)
    else:
        warning = (
            '<div class="admonition warning"><p class="admonition-title">This run contradicts the text</p>'
            f"<p>The text here assumes that {html.escape(str(text))}; this run's numbers do not "
            "satisfy it. Read the numbers, not the sentence.</p></div>"
        )
        display(
            {"text/html": warning, "text/plain": f"WARNING: the text assumes that {text}"},
            metadata=payload,
            raw=True,
        )
    return holds
