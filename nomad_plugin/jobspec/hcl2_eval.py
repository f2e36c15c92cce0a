"""A job file's HCL2 evaluated as Nomad's ``jobspec2`` evaluates it, before decoding.

``jobspec2/types.config.go`` (``decodeBody``) reads ``variable``/``variables`` blocks, takes their
values from defaults, ``NOMAD_VAR_*``, ``-var-file`` and ``-var`` (``types.variables.go``,
``collectInputVariableValues``: the last wins, every declared variable must end with a value), evaluates
``locals`` (retrying those that name a later one), then expands ``dynamic`` blocks (HCL's ``dynblock``)
and evaluates every expression with ``var``, ``local`` and the functions of ``jobspec2/functions.go``.
A name Nomad does not define (``node``, ``attr``, ``meta``, ``device``, ``NOMAD_*``, ...) is kept as its
``${...}`` text for the scheduler (``EvalContext``'s ``UnknownVariable``; ``parse_test.go``'s
``TestParse_UndefinedVariables``: an interpolation keeps its source text, a bare reference becomes
``"${<reference>}"``); such a reference anywhere else is not evaluated.

The parse tree is python-hcl2's (lark); syntax HashiCorp's ``hclsyntax`` refuses and python-hcl2's grammar
accepts (a template in a block label, two arguments on one line) is refused here with hclsyntax's
message and position. The result is python-hcl2's ``loads`` form, so ``parse.py``'s decoder reads it as
before; a value this module cannot evaluate is an ``Unknown`` (its text ``${...}``), and is listed, so
check-job says it cannot tell instead of deciding on a partial reading.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hcl2
from lark import Token, Tree

from nomad_plugin.jobspec.hcl2_functions import (
    NOMAD_FUNCTIONS,
    FunctionError,
    equal,
    functions,
    to_bool,
    to_number,
    to_string,
)
from nomad_plugin.util.hcl import unquote

_TYPES = {"string": str, "number": Decimal, "bool": bool}
_VAR_PREFIX = "NOMAD_VAR_"
Node = Tree[Any]


class Unknown(str):
    """A value check-job does not evaluate: its text is ``${<source>}``, ``why`` says what is missing."""

    why: str

    def __new__(cls, text: str, why: str) -> Unknown:
        made = super().__new__(cls, text)
        made.why = why
        return made


class HclError(Exception):
    """An HCL diagnostic Nomad reports (the job is refused): ``file:line,col-col: Summary; Detail``."""

    def __init__(self, summary: str, detail: str, node: Any = None, source: str = "") -> None:
        super().__init__(f"{summary}; {detail}")
        self.summary, self.detail, self.node, self.source = summary, detail, node, source

    def text(self, source: str) -> str:
        if not self.summary:  # python-hcl2's own syntax error, already placed
            return self.detail
        meta = getattr(self.node, "meta", None) if isinstance(self.node, Tree) else self.node
        line = getattr(meta, "line", None)
        if line is None:
            return f"{self.source or source}: {self.summary}; {self.detail}"
        end_line, end = getattr(meta, "end_line", line), getattr(meta, "end_column", None)
        where = f"{line},{getattr(meta, 'column', 0)}" + (
            "" if end is None else f"-{end}" if end_line == line else f"-{end_line},{end}"
        )
        return f"{self.source or source}:{where}: {self.summary}; {self.detail}"


@dataclass
class Inputs:
    """What ``nomad job run`` adds to the file: ``-var NAME=VALUE``, ``-var-file`` texts, ``NOMAD_VAR_*``."""

    args: list[str] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)  # (name, text)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Reading:
    body: dict[str, Any]
    unknown: list[str]


def _sig(node: Node) -> list[Any]:
    """A node's children that carry meaning: trees other than line breaks, and names."""
    return [c for c in node.children if (isinstance(c, Tree) and c.data != "new_line_or_comment")]


def _name(node: Any) -> str:
    return str(node.children[0]) if isinstance(node, Tree) else str(node)


def _quote(text: str) -> str:
    """The quoted HCL literal ``util.hcl.unquote`` turns back into ``text``."""
    body = json.dumps(text, ensure_ascii=False)[1:-1].replace("${", "$${").replace("%{", "%%{")
    return f'"{body}"'


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    return "tuple" if isinstance(value, list) else "object" if isinstance(value, dict) else "null"


def convert(value: Any, spec: Any) -> Any:
    """cty's ``convert.Convert`` to a type constraint (``typeexpr``); FunctionError with cty's reason."""
    if spec == "any" or value is None or isinstance(value, Unknown):
        return value
    if isinstance(spec, str):
        if spec == "string":
            return to_string(value) if not isinstance(value, (list, dict)) else _refuse("string required")
        if spec == "number":
            return to_number(value) if not isinstance(value, (list, dict, bool)) else _refuse("number required")
        return to_bool(value) if not isinstance(value, (list, dict, Decimal)) else _refuse("bool required")
    kind, inner = spec
    if kind in ("list", "set"):
        if not isinstance(value, list):
            return _refuse(f"{kind} of {_type_name(inner)} required")
        return [convert(v, inner) for v in value]
    if kind == "map":
        if not isinstance(value, dict):
            return _refuse(f"map of {_type_name(inner)} required")
        return {k: convert(v, inner) for k, v in value.items()}
    raise FunctionError(f"check-job does not convert to {kind}(...) types")


def _refuse(reason: str) -> Any:
    raise FunctionError(reason)


def _type_name(spec: Any) -> str:
    return spec if isinstance(spec, str) else f"{spec[0]} of {_type_name(spec[1])}"


class Evaluator:
    """One job file's evaluation: its text (for source ranges), functions and what was not evaluated."""

    def __init__(self, text: str, source: str, base_dir: Path) -> None:
        self.text, self.source = text, source
        self.functions = functions(base_dir)
        self.unknown: list[str] = []

    # --- expressions ----------------------------------------------------------------------------

    def src(self, node: Node) -> str:
        return self.text[node.meta.start_pos : node.meta.end_pos]

    def not_evaluated(self, node: Node, why: str) -> Unknown:
        where = f"{self.source}:{node.meta.line},{node.meta.column}"
        self.unknown.append(f"{where}: {why}")
        return Unknown("${" + self.src(node) + "}", why)

    def runtime_root(self, node: Node, scope: dict[str, Any]) -> str:
        """The root name when ``node`` is a reference (attributes, literal indexes) to a name Nomad leaves
        for the scheduler, else ''."""
        while node.data in ("expr_term", "get_attr_expr_term", "index_expr_term"):
            kids = _sig(node)
            if node.data == "index_expr_term" and kids[1].data == "braces_index":
                key = _sig(kids[1])[0]
                lit = _sig(key)[0] if key.data == "expr_term" and len(key.children) == 1 else key
                plain = lit.data == "string" and all(isinstance(p.children[0], Token) for p in _sig(lit))
                if not (plain or lit.data in ("int_lit", "float_lit", "literal_value")):
                    return ""
            if len(kids) != (1 if node.data == "expr_term" else 2) or (
                node.data == "expr_term" and any(isinstance(c, Token) and c.type == "LPAR" for c in node.children)
            ):
                return ""
            node = kids[0]
        name = _name(node) if node.data == "identifier" else ""
        return name if name and name not in scope else ""

    def value(self, node: Node, scope: dict[str, Any]) -> Any:
        if self.runtime_root(node, scope):
            return self.runtime_text(node.meta.start_pos, node.meta.end_pos)
        try:
            return self.ev(node, scope)
        except FunctionError as exc:
            raise HclError("Invalid value", str(exc), node) from None

    def runtime_text(self, start: int, end: int) -> str:
        """jobspec2's ``UndefinedVariable`` (``types.config.go``): the reference's source text, with the
        ``${`` before it and the spaces and ``}`` after it when only spaces separate them, else wrapped
        in ``${...}``."""
        text, ref = self.text, self.text[start:end]
        opening = start - 1
        while opening >= 1 and text[opening] == " ":
            opening -= 1
        if opening < 1 or text[opening - 1 : opening + 1] != "${":
            return "${" + ref + "}"
        ref = text[opening - 1 : start] + ref
        for i in range(end + 1, len(text)):  # Nomad scans from the second character after the reference
            if text[i] == "}":
                ref += text[end:i]
            elif text[i] != " ":
                return ref + "}"
        return ref

    def ev(self, node: Any, scope: dict[str, Any]) -> Any:
        data = node.data
        kids = _sig(node)
        if data == "expr_term":
            return self.value(kids[0], scope)
        if data in ("int_lit", "float_lit"):
            return Decimal(str(node.children[0]))
        if data == "literal_value":
            return {"true": True, "false": False, "null": None}[str(node.children[0])]
        if data == "identifier":
            return scope[_name(node)] if _name(node) in scope else self.value(node, scope)
        if data == "string":
            return self.template([c for p in node.children if isinstance(p, Tree) for c in p.children], scope)
        if data in ("heredoc_template", "heredoc_template_trim"):
            return self.heredoc(node, scope)
        if data == "tuple":
            return [self.value(k, scope) for k in kids]
        if data == "object":
            return self.object(kids, scope)
        if data == "function_call":
            return self.call(node, scope)
        if data in ("get_attr_expr_term", "index_expr_term"):
            return self.step(self.value(kids[0], scope), kids[1], scope)
        if data in ("attr_splat_expr_term", "full_splat_expr_term"):
            base = self.value(kids[0], scope)
            if isinstance(base, Unknown):
                return base
            items = [] if base is None else base if isinstance(base, list) else [base]
            out = []
            for item in items:
                for op in _sig(kids[1]):
                    item = self.step(item, op, scope)
                out.append(item)
            return out
        if data in ("for_tuple_expr", "for_object_expr"):
            return self.for_expr(node, scope)
        if data == "conditional":
            return self.conditional(kids, scope)
        if data == "binary_op":
            operator, right = kids[1].children[0], _sig(kids[1])[-1]
            return self.binary(str(operator.children[0]), kids[0], right, scope, node)
        if data == "unary_op":
            operand = self.value(kids[0], scope)
            if isinstance(operand, Unknown):
                return operand
            if str(node.children[0]) == "-":
                return -self.operand(to_number, operand, "unary", node)
            return not self.operand(to_bool, operand, "unary", node)
        return self.not_evaluated(node, f"check-job does not evaluate {self.src(node)!r}")

    def operand(self, conv: Any, value: Any, side: str, node: Node) -> Any:
        try:
            return conv(value)
        except FunctionError as exc:
            if side == "if":
                raise HclError("Invalid 'for' condition", f"The 'if' clause value is invalid: {exc}.", node) from None
            raise HclError("Invalid operand", f"Unsuitable value for {side} operand: {exc}.", node) from None

    def binary(self, op: str, left_node: Node, right_node: Node, scope: dict[str, Any], node: Node) -> Any:
        left, right = self.value(left_node, scope), self.value(right_node, scope)
        for side in (left, right):
            if isinstance(side, Unknown):
                return side
        if op in ("==", "!="):
            return equal(left, right) == (op == "==")
        if op in ("&&", "||"):
            a, b = self.operand(to_bool, left, "left", node), self.operand(to_bool, right, "right", node)
            return (a and b) if op == "&&" else (a or b)
        a, b = self.operand(to_number, left, "left", node), self.operand(to_number, right, "right", node)
        if op in ("<", ">", "<=", ">="):
            return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        with localcontext() as ctx:
            ctx.prec = 154  # about cty's 512-bit mantissa
            if op in "/%" and b == 0:
                if a == 0:
                    raise HclError(
                        "Operation failed",
                        "Error during operation: can't divide zero by zero or infinity by infinity.",
                        node,
                    )
                return self.not_evaluated(node, f"{self.src(node)} is infinite")
            return {"+": a + b, "-": a - b, "*": a * b}[op] if op in "+-*" else (a / b if op == "/" else a % b)

    def conditional(self, kids: list[Node], scope: dict[str, Any]) -> Any:
        cond = self.value(kids[0], scope)
        if isinstance(cond, Unknown):
            return cond
        if cond is None:
            raise HclError(
                "Null condition", "The condition value is null. Conditions must either be true or false.", kids[0]
            )
        try:
            chosen = to_bool(cond)
        except FunctionError:
            raise HclError(
                "Incorrect condition type", "The condition expression must be of type bool.", kids[0]
            ) from None
        result, other = self.value(kids[1], scope), self.value(kids[2], scope)
        if not chosen:
            result, other = other, result
        if isinstance(other, Unknown):
            return other
        if _kind(result) in ("number", "bool") and _kind(other) == "string":
            return to_string(result)  # cty unifies the two results' types: string wins
        return result

    def step(self, base: Any, op: Node, scope: dict[str, Any]) -> Any:
        """One ``.name``, ``[key]`` or ``.0`` applied to a value (hcl's traversal rules)."""
        if isinstance(base, Unknown):
            return base
        if op.data == "get_attr":
            key: Any = _name(_sig(op)[0])
            if isinstance(base, list):
                raise HclError("Unsupported attribute", "This value does not have any attributes.", op)
            if base is None:
                raise HclError(
                    "Attempt to get attribute from null value",
                    "This value is null, so it does not have any attributes.",
                    op,
                )
            if not isinstance(base, dict):
                raise HclError(
                    "Unsupported attribute", f"Can't access attributes on a primitive-typed value ({_kind(base)}).", op
                )
            if key not in base:
                raise HclError("Unsupported attribute", f'This object does not have an attribute named "{key}".', op)
            return base[key]
        key = Decimal(str(op.children[1])) if op.data == "short_index" else self.value(_sig(op)[0], scope)
        if isinstance(key, Unknown):
            return key
        if base is None:
            raise HclError("Attempt to index null value", "This value is null, so it does not have any indices.", op)
        missing = "The given key does not identify an element in this collection value"
        if isinstance(base, dict) and isinstance(key, Decimal):
            raise HclError(
                "Invalid index",
                f"{missing}. An object only supports looking up attributes by name, not by numeric index.",
                op,
            )
        if isinstance(base, dict) and isinstance(key, str) and key in base:
            return base[key]
        if isinstance(base, list) and not isinstance(key, (bool, list, dict)) and key is not None:
            try:
                index = to_number(key)
            except FunctionError as exc:
                raise HclError("Invalid index", f"{missing}: {exc}.", op) from None
            if index == index.to_integral_value() and 0 <= index < len(base):
                return base[int(index)]
        raise HclError("Invalid index", f"{missing}.", op)

    def object(self, elems: list[Node], scope: dict[str, Any]) -> Any:
        out: dict[str, Any] = {}
        for elem in elems:
            key_node, value_node = _sig(elem)
            inner = _sig(key_node)[0]
            bare = inner.data == "keyword" or (
                inner.data == "expr_term" and _sig(inner)[0].data == "identifier" and len(inner.children) == 1
            )
            key = (
                _name(_sig(inner)[0])
                if bare and inner.data == "expr_term"
                else _name(inner)
                if bare
                else self.value(inner, scope)
            )
            if isinstance(key, Unknown):
                return key
            if key is None or isinstance(key, (list, dict)):
                raise HclError("Incorrect key type", "Can't use this value as a key: string required.", key_node)
            out[to_string(key)] = self.value(value_node, scope)
        return out

    def call(self, node: Node, scope: dict[str, Any]) -> Any:
        kids = _sig(node)
        name = _name(kids[0])
        if len(kids) > 1 and kids[1].data == "identifier":
            return self.not_evaluated(node, f"check-job does not implement function {self.src(node).split('(')[0]}")
        arg_nodes = _sig(kids[-1]) if kids[-1].data == "arguments" else []
        if name not in NOMAD_FUNCTIONS:
            raise HclError("Call to unknown function", f'There is no function named "{name}".', kids[0])
        if name not in self.functions:
            return self.not_evaluated(node, f"check-job does not implement function {name}")
        args = [self.value(a, scope) for a in arg_nodes]
        expand = kids[-1].data == "arguments" and any(
            isinstance(c, Token) and c.type == "ELLIPSIS" for c in kids[-1].children
        )
        if expand and args:
            if not isinstance(args[-1], list):
                raise HclError(
                    "Invalid expanding argument value",
                    "The expanding argument (indicated by ...) must be of a tuple, list, or set type.",
                    arg_nodes[-1],
                )
            args = [*args[:-1], *args[-1]]
        for arg in args:
            if isinstance(arg, Unknown) or (isinstance(arg, list) and any(isinstance(a, Unknown) for a in arg)):
                return arg if isinstance(arg, Unknown) else next(a for a in arg if isinstance(a, Unknown))
        try:
            return self.functions[name](*args)
        except NotImplementedError as exc:
            return self.not_evaluated(node, f"check-job does not evaluate {name}(): {exc}")
        except TypeError:
            raise _arity(name, self.functions[name], len(args), node) from None
        except (FunctionError, ValueError, ArithmeticError, re.error) as exc:
            raise HclError("Error in function call", f'Call to function "{name}" failed: {exc}.', node) from None

    def for_expr(self, node: Node, scope: dict[str, Any]) -> Any:
        kids = _sig(node)
        intro, body = kids[0], kids[1:]
        names = [_name(n) for n in _sig(intro) if n.data == "identifier"]
        collection = self.value(_sig(intro)[-1], scope)
        if isinstance(collection, Unknown):
            return collection
        if collection is None:
            raise HclError(
                "Iteration over null value",
                "A null value cannot be used as the collection in a 'for' expression.",
                intro,
            )
        if isinstance(collection, dict):
            pairs = [(k, collection[k]) for k in sorted(collection)]
        elif isinstance(collection, list):
            pairs = [(Decimal(i), v) for i, v in enumerate(collection)]
        else:
            raise HclError(
                "Iteration over non-iterable value",
                f"A value of type {_kind(collection)} cannot be used as the collection in a 'for' expression.",
                intro,
            )
        cond = body[-1] if body[-1].data == "for_cond" else None
        grouped = any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in node.children)
        out_list: list[Any] = []
        out_map: dict[str, Any] = {}
        for key, item in pairs:
            inner = {
                **scope,
                **dict(
                    zip(
                        names[::-1] if len(names) == 1 else names,
                        [item] if len(names) == 1 else [key, item],
                        strict=True,
                    )
                ),
            }
            if cond is not None:
                keep = self.value(_sig(cond)[0], inner)
                if isinstance(keep, Unknown):
                    return keep
                if not self.operand(to_bool, keep, "if", cond):
                    continue
            if node.data == "for_tuple_expr":
                out_list.append(self.value(body[0], inner))
                continue
            k = self.value(body[0], inner)
            if isinstance(k, Unknown):
                return k
            k = to_string(k)
            v = self.value(body[1], inner)
            if grouped:
                out_map.setdefault(k, []).append(v)
            elif k in out_map:
                raise HclError(
                    "Duplicate object key",
                    f"Two different items produced the key \"{k}\" in this 'for' expression. If duplicates are expected, use the ellipsis (...) after the value expression to enable grouping by key.",
                    body[0],
                )
            else:
                out_map[k] = v
        return out_list if node.data == "for_tuple_expr" else out_map

    # --- templates ------------------------------------------------------------------------------

    def template(self, parts: list[Any], scope: dict[str, Any]) -> Any:
        """A quoted template's parts: literal text, ``${...}``, ``%{if}``/``%{for}`` directives."""
        interps = [p for p in parts if isinstance(p, Tree) and p.data == "interpolation"]
        if len(parts) == 1 and interps:  # "${x}" alone is x itself, not converted to a string
            return self.value(_sig(interps[0])[0], scope)
        out, _ = self.sequence(parts, 0, scope, ())
        return out

    def sequence(self, parts: list[Any], i: int, scope: dict[str, Any], stop: tuple[str, ...]) -> tuple[Any, int]:
        chunks: list[str] = []
        unknown: Unknown | None = None
        while i < len(parts):
            part = parts[i]
            kind = part.data if isinstance(part, Tree) else "text"
            if kind in stop:
                break
            i += 1
            if kind == "text":
                chunks.append(unquote('"' + str(part) + '"') if part.type == "STRING_CHARS" else str(part)[1:])
            elif kind == "interpolation":
                expr = _sig(part)[0]
                unknown = unknown or self.interpolated(self.value(expr, scope), expr, chunks)
            elif kind == "template_if_start":
                cond = self.value(_sig(part)[0], scope)
                yes, i = self.sequence(parts, i, scope, ("template_else", "template_endif"))
                no = ""
                if i < len(parts) and parts[i].data == "template_else":
                    no, i = self.sequence(parts, i + 1, scope, ("template_endif",))
                i += 1
                if isinstance(cond, Unknown):
                    unknown = unknown or cond
                    continue
                chosen = yes if to_bool(cond) else no
                unknown = unknown or self.interpolated(chosen, part, chunks)
            elif kind == "template_for_start":
                start = i
                names = [_name(n) for n in _sig(part) if n.data == "identifier"]
                collection = self.value(_sig(part)[-1], scope)
                _, i = self.sequence(parts, start, scope | {n: "" for n in names}, ("template_endfor",))
                i += 1
                if isinstance(collection, Unknown):
                    unknown = unknown or collection
                    continue
                pairs = (
                    sorted(collection.items()) if isinstance(collection, dict) else list(enumerate(collection or []))
                )
                pairs = [(Decimal(k) if isinstance(k, int) else k, v) for k, v in pairs]
                for key, item in pairs:
                    bound = dict(zip(names[::-1], [item, key], strict=False))
                    text, _ = self.sequence(parts, start, {**scope, **bound}, ("template_endfor",))
                    unknown = unknown or self.interpolated(text, part, chunks)
            else:
                return self.not_evaluated(part, "check-job does not evaluate this template directive"), i
        return (unknown if unknown is not None else "".join(chunks)), i

    def interpolated(self, value: Any, node: Node, chunks: list[str]) -> Unknown | None:
        if isinstance(value, Unknown):
            return value
        if value is None:
            raise HclError(
                "Invalid template interpolation value",
                "The expression result is null. Cannot include a null value in a string template.",
                node,
            )
        if isinstance(value, (list, dict)):
            raise HclError(
                "Invalid template interpolation value",
                "Cannot include the given value in a string template: string required.",
                node,
            )
        chunks.append(to_string(value))
        return None

    def heredoc(self, node: Node, scope: dict[str, Any]) -> Any:
        raw = str(node.children[0])
        lines = raw.split("\n")[1:-2]
        if node.data == "heredoc_template_trim":
            indents = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
            cut = min(indents, default=0)
            lines = [line[cut:] for line in lines]
        body = "".join(line + "\n" for line in lines)
        if "${" not in body and "%{" not in body:
            return body
        try:
            tree = hcl2.parses_to_tree(f"x = {_requote(body)}\n")
        except Exception:  # python-hcl2 raises lark's and its own errors
            return self.not_evaluated(node, "check-job does not evaluate this heredoc's template")
        string = _sig(_sig(_items(tree.children[0])[0])[-1])[0]  # x = "..." -> its string
        sub = Evaluator(f"x = {_requote(body)}\n", self.source, Path())
        sub.functions, sub.unknown = self.functions, self.unknown
        try:
            return sub.template([c for p in string.children if isinstance(p, Tree) for c in p.children], scope)
        except HclError as exc:
            raise HclError(exc.summary, exc.detail, node) from None


def _arity(name: str, function: Any, given: int, node: Node) -> HclError:
    """hclsyntax's errors for a call with the wrong number of arguments."""
    params = [p for p in inspect.signature(function).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    if given < len(params):
        return HclError(
            "Not enough function arguments",
            f'Function "{name}" expects {len(params)} argument(s). Missing value for "{params[given].name}".',
            node,
        )
    return HclError("Too many function arguments", f'Function "{name}" expects only {len(params)} argument(s).', node)


def _requote(body: str) -> str:
    """A heredoc's text as one quoted template: literal text escaped, ``${...}``/``%{...}`` kept verbatim."""
    out, i = ['"'], 0
    while i < len(body):
        if body.startswith(("${", "%{"), i) and not body.startswith(("$${", "%%{"), max(i - 1, 0)):
            depth, j = 0, i + 1
            while j < len(body):
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                if depth == 0:
                    break
                j += 1
            out.append(body[i : j + 1])
            i = j + 1
            continue
        out.append({'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(body[i], body[i]))
        i += 1
    return "".join(out) + '"'


# --- bodies, blocks and dynamic blocks ------------------------------------------------------------


def _item_name(item: Node) -> str:
    return _name(item.children[0])


_ONE_LINE = "Invalid single-argument block definition"


def _newline(node: Node) -> Any:
    """hclsyntax's newline token: the line break alone (python-hcl2's also holds the next line's indent)."""
    text = str(node.children[0])
    line, column = node.meta.line, node.meta.column + text.index("\n")
    return SimpleNamespace(line=line, column=column, end_line=line + 1, end_column=1)


def check_syntax(body: Node, closing: Any = None) -> None:
    """hclsyntax's body rules python-hcl2's grammar lacks (``parser.go``): a newline after every argument
    and block, a one-line block holds one argument, a block opens on its header's line, labels hold no
    template. ``closing`` is the enclosing block's ``}`` (None at the top level)."""
    kids = [c for c in body.children if isinstance(c, Tree)]
    single = bool(kids) and kids[0].data != "new_line_or_comment" and closing is not None
    for index, child in enumerate(kids):
        if child.data == "new_line_or_comment":
            continue
        after = kids[index + 1] if index + 1 < len(kids) else closing
        if single and child.data == "block":
            nxt = child.children[1]
            end: Any = nxt.children[0] if isinstance(nxt, Tree) else nxt
            span = SimpleNamespace(
                line=child.meta.line, column=child.meta.column, end_line=end.end_line, end_column=end.end_column
            )
            raise HclError(
                "Argument definition required",
                f"A single-line block definition can contain only a single argument. If you meant to define argument {json.dumps(_item_name(child))}, use an equals sign to assign it a value. To define a nested block, place it on a line of its own within its parent block.",
                span,
            )
        if child.data == "block":
            _check_block(child)
        if single and after is not closing:
            if after.data == "new_line_or_comment":
                raise HclError(
                    _ONE_LINE,
                    "An argument definition on the same line as its containing block creates a single-line block definition, which must also be closed on the same line. Place the block's closing brace immediately after the argument definition.",
                    _newline(after),
                )
            raise HclError(
                _ONE_LINE,
                "A single-line block definition must end with a closing brace immediately after its single argument definition.",
                after.children[0],
            )
        ended = _ends_in_newline(child) or (isinstance(after, Tree) and after.data == "new_line_or_comment")
        if not single and after is not None and not ended:
            what = (
                ("argument", "An argument definition")
                if child.data == "attribute"
                else ("block definition", "A block definition")
            )
            raise HclError(
                f"Missing newline after {what[0]}",
                f"{what[1]} must end with a newline.",
                after.children[0] if isinstance(after, Tree) else after,
            )


def _ends_in_newline(node: Any) -> bool:
    """python-hcl2 keeps the line break after an operator expression inside the expression's tree, and
    after a heredoc inside the heredoc's token."""
    while isinstance(node, Tree) and node.children:
        if node.data == "new_line_or_comment":
            return True
        node = node.children[-1]
    return isinstance(node, Token) and node.type.startswith("HEREDOC")


def _check_block(block: Node) -> None:
    for label in block.children[1:]:
        if isinstance(label, Tree) and label.data == "new_line_or_comment":
            detail = 'A block definition must have block content delimited by "{" and "}", starting on the same line as the block header.'
            raise HclError("Invalid block definition", detail, _newline(label))
        for part in label.children if isinstance(label, Tree) and label.data == "string" else []:
            inner = part.children[0] if isinstance(part, Tree) and part.children else None
            if isinstance(inner, Tree):
                which = "$" if inner.data == "interpolation" else "%"
                detail = f'Template sequences are not allowed in this string. To include a literal "{which}", double it (as "{which}{which}") to escape it.'
                raise HclError("Invalid string literal", detail, inner.children[0])
    check_syntax(_block_body(block), block.children[-1])


def _labels(block: Node) -> list[str]:
    labels = []
    for label in block.children[1:]:
        if isinstance(label, Token):
            break
        if label.data == "string":
            labels.append(
                unquote("".join(str(p.children[0]) for p in label.children if isinstance(p, Tree)).join('""'))
            )
        elif label.data != "new_line_or_comment":
            labels.append(_name(label))
    return labels


def _block_body(block: Node) -> Node:
    return next(c for c in block.children if isinstance(c, Tree) and c.data == "body")


def _items(body: Node) -> list[Node]:
    return [c for c in body.children if isinstance(c, Tree) and c.data in ("attribute", "block")]


def _attributes(body: Node) -> dict[str, Node]:
    return {_item_name(i): _sig(i)[-1] for i in _items(body) if i.data == "attribute"}


def loads_form(value: Any) -> Any:
    """An evaluated value in python-hcl2's ``loads`` form: strings quoted, numbers int or ``${<decimal>}``."""
    if isinstance(value, Unknown) or value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else "${" + to_string(value) + "}"
    if isinstance(value, list):
        return [loads_form(v) for v in value]
    return {k: loads_form(v) for k, v in value.items()}


class BodyReader:
    """Turns bodies into python-hcl2's form, expanding ``dynamic`` blocks as ``ext/dynblock`` does."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev

    def body(self, body: Node, scope: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in _items(body):
            name = _item_name(item)
            if item.data == "attribute":
                out[name] = loads_form(self.ev.value(_sig(item)[-1], scope))
            elif name == "dynamic":
                self.dynamic(item, scope, out)
            else:
                self.add(out, name, _labels(item), self.body(_block_body(item), scope))
        return out

    @staticmethod
    def add(out: dict[str, Any], kind: str, labels: list[str], content: dict[str, Any]) -> None:
        content["__is_block__"] = True
        for label in reversed(labels):
            content = {_quote(label): content}
        out.setdefault(kind, []).append(content)

    def dynamic(self, block: Node, scope: dict[str, Any], out: dict[str, Any]) -> None:
        labels = _labels(block)
        if len(labels) != 1:
            raise HclError(
                "Extraneous label for dynamic" if labels else "Missing name for dynamic",
                "A dynamic block must have exactly one label: the type of the block to generate.",
                block,
            )
        kind, body = labels[0], _block_body(block)
        attrs = _attributes(body)
        contents = [b for b in _items(body) if b.data == "block" and _item_name(b) == "content"]
        if "for_each" not in attrs or len(contents) != 1:
            missing = 'argument "for_each"' if "for_each" not in attrs else 'a "content" block'
            raise HclError(
                "Missing required argument" if "for_each" not in attrs else "Missing content block",
                f"A dynamic block requires {missing}.",
                block,
            )
        iterator = kind
        if "iterator" in attrs:
            root = self.ev.runtime_root(attrs["iterator"], {})
            if not root:
                raise HclError(
                    "Invalid dynamic iterator name",
                    "Dynamic iterator must be a single variable name.",
                    attrs["iterator"],
                )
            iterator = root
        each = self.ev.value(attrs["for_each"], scope)
        if isinstance(each, Unknown):
            self.ev.unknown.append(f'{self.ev.source}: dynamic "{kind}" is not expanded: its for_each is not evaluated')
            return
        if each is None or not isinstance(each, (list, dict)):
            reason = (
                "Cannot use a null value in for_each."
                if each is None
                else f"Cannot use a {_kind(each)} value in for_each. An iterable collection is required."
            )
            raise HclError("Invalid dynamic for_each value", reason, attrs["for_each"])
        pairs = sorted(each.items()) if isinstance(each, dict) else [(Decimal(i), v) for i, v in enumerate(each)]
        for key, item in pairs:
            inner = {**scope, iterator: {"key": key, "value": item}}
            names: list[str] = []
            if "labels" in attrs:
                raw = self.ev.value(attrs["labels"], inner)
                if isinstance(raw, Unknown) or (isinstance(raw, list) and any(isinstance(v, Unknown) for v in raw)):
                    self.ev.unknown.append(
                        f'{self.ev.source}: dynamic "{kind}" is not expanded: its labels are not evaluated'
                    )
                    return
                if not isinstance(raw, list) or any(v is None or isinstance(v, (list, dict)) for v in raw):
                    raise HclError(
                        "Invalid dynamic block label",
                        "Cannot use this value as a dynamic block label: a list of strings is required.",
                        attrs["labels"],
                    )
                names = [to_string(v) for v in raw]
            self.add(out, kind, names, self.body(_block_body(contents[0]), inner))


# --- variables and locals ---------------------------------------------------------------------------


def _type_spec(node: Node) -> Any:
    """``typeexpr``: string, number, bool, any, list(T), set(T), map(T); other constraints are refused."""
    kids = _sig(node)
    inner = kids[0] if node.data == "expr_term" else node
    if inner.data == "identifier" and _name(inner) in (*_TYPES, "any"):
        return _name(inner)
    if inner.data == "function_call":
        name = _name(_sig(inner)[0])
        args = _sig(_sig(inner)[-1]) if _sig(inner)[-1].data == "arguments" else []
        if name in ("list", "set", "map") and len(args) == 1:
            return (name, _type_spec(args[0]))
        if name in ("object", "tuple"):
            return ("unsupported", name)
    raise HclError(
        "Invalid type specification",
        "A type specification is either a primitive type keyword (bool, number, string) or a complex type constructor call, like list(string).",
        node,
    )


@dataclass
class _Variable:
    name: str
    spec: Any
    node: Node
    values: list[Any] = field(default_factory=list)


_HEREDOC = re.compile(r"<<-?([A-Za-z][A-Za-z0-9._-]*)\r?\n")


def heredoc_markers(text: str) -> str:
    """A heredoc's closing marker with spaces after it closes it in hclsyntax (it trims the line), not in
    python-hcl2's grammar: those spaces are dropped (nothing else on any line moves)."""
    markers = set(_HEREDOC.findall(text))
    if not markers:
        return text
    lines = text.split("\n")
    return "\n".join(line.rstrip(" \t") if line.strip() in markers else line for line in lines)


def _parse(text: str, source: str) -> Node:
    from nomad_plugin.util.hcl import describe_hcl_error

    try:
        tree = hcl2.parses_to_tree(text)
    except Exception as exc:  # python-hcl2 raises lark's and its own errors
        raise HclError("", describe_hcl_error(exc, text, source)) from None
    check_syntax(tree.children[0])
    return tree


def _converted(var: _Variable, value: Any, summary: str, detail: str, node: Any, source: str = "") -> Any:
    if var.spec is None:
        return value
    if isinstance(var.spec, tuple) and var.spec[0] == "unsupported":
        return Unknown("${var." + var.name + "}", f"check-job does not evaluate {var.spec[1]}(...) variable types")
    try:
        return convert(value, var.spec)
    except FunctionError as exc:
        raise HclError(summary, detail.format(name=var.name, err=exc), node, source) from None


def _variables(ev: Evaluator, body: Node, inputs: Inputs) -> dict[str, Any]:
    """``decodeInputVariables`` and ``collectInputVariableValues``: defaults, env, var files, -var."""
    declared: dict[str, _Variable] = {}
    for item in _items(body):
        kind = _item_name(item)
        if item.data != "block" or kind not in ("variable", "variables"):
            continue
        pairs: list[tuple[str, Node | None, Any]] = []
        if kind == "variables":
            pairs = [(n, a, None) for n, a in _attributes(_block_body(item)).items()]
        if kind == "variable":
            (name,) = _labels(item) or [""]
            attrs = _attributes(_block_body(item))
            spec = _type_spec(attrs["type"]) if "type" in attrs else None
            pairs = [(name, attrs.get("default"), spec)]
        for name, default, spec in pairs:
            if name in declared:
                raise HclError("Duplicate variable", f"Duplicate {name} variable definition found.", item)
            var = declared[name] = _Variable(name, spec, item)
            if default is not None:
                value = ev.value(default, {})
                detail = "This default value is not compatible with the variable's type constraint: {err}."
                var.values.append(_converted(var, value, "Invalid default value for variable", detail, default))
    for raw in inputs.env.items():
        name = raw[0][len(_VAR_PREFIX) :]
        if raw[0].startswith(_VAR_PREFIX) and name in declared:
            var = declared[name]
            value = _cli_value(ev, var, raw[1], f"<value for var.{name} from env>")
            detail = "The value for {name} is not compatible with the variable's type constraint: {err}."
            var.values.append(
                _converted(var, value, "Invalid value for variable", detail, None, f"<value for var.{name} from env>")
            )
    for file_name, text in inputs.files:
        tree = _parse(text, file_name)
        file_ev = Evaluator(text, file_name, Path())
        for item in _items(_sig(tree)[0]):
            if item.data == "block":
                raise HclError(
                    "Variable declaration in a .var file",
                    f'A .var file is used to assign values to variables that have already been declared in job files, not to declare new variables. To declare variable "{_item_name(item)}", place this block in one of your job files\n\nTo set a value for this variable in {file_name}, use the definition syntax instead:\n    {_labels(item)[0] if _labels(item) else ""} = <value>',
                    item,
                    file_name,
                )
            name = _item_name(item)
            if name not in declared:  # an error: `nomad job run` is -hcl2-strict by default
                detail = f'A "{name}" variable was set but was not found in known variables. To declare variable "{name}", place this block in your job files'
                raise HclError("Undefined variable", detail, item, file_name)
            if name in declared:
                value = file_ev.value(_sig(item)[-1], {})
                detail = "The value for {name} is not compatible with the variable's type constraint: {err}."
                declared[name].values.append(
                    _converted(declared[name], value, "Invalid value for variable", detail, _sig(item)[-1], file_name)
                )
    for arg in inputs.args:
        name, sep, text = arg.partition("=")
        if sep and name not in declared:
            detail = f'A "{name}" variable was passed in the command line but was not found in known variables. To declare variable "{name}", place this block in your job file'
            raise HclError("Undefined -var variable", detail, None, "-var")
        if sep:
            var = declared[name]
            source = f"<value for var.{name} from arguments>"
            detail = "The received arg value for {name} is not compatible with the variable's type constraint: {err}."
            var.values.append(
                _converted(
                    var,
                    _cli_value(ev, var, text, source),
                    "Invalid argument value for -var variable",
                    detail,
                    None,
                    source,
                )
            )
    for var in declared.values():
        if not var.values:
            raise HclError(
                f'Unset variable "{var.name}"',
                "A used variable must be set or have a default value; see https://developer.hashicorp.com/nomad/docs/reference/hcl2/variables  for details.",
                var.node,
            )
    return {name: var.values[-1] for name, var in declared.items()}


def _cli_value(ev: Evaluator, var: _Variable, text: str, source: str) -> Any:
    """``expressionFromVariableDefinition``: a string, number or untyped variable takes the text as it is;
    any other type reads it as an HCL expression."""
    if var.spec in (None, "string", "number"):
        return text
    tree = _parse(f"v = {text}\n", source)
    return Evaluator(f"v = {text}\n", source, Path()).value(_sig(_items(_sig(tree)[0])[0])[-1], {})


def _locals(ev: Evaluator, body: Node, variables: dict[str, Any]) -> dict[str, Any]:
    """``evaluateLocalVariables``: each local in turn; one that fails waits for the others (a local may
    name a later one), and the last failure is the error."""
    pending = [
        (n, e)
        for item in _items(body)
        if item.data == "block" and _item_name(item) == "locals"
        for n, e in _attributes(_block_body(item)).items()
    ]
    done: dict[str, Any] = {}
    while pending:
        progress = False
        failure: HclError | None = None
        for name, expr in list(pending):
            try:
                done[name] = ev.value(expr, {"var": variables, "local": done})
            except HclError as exc:
                failure = exc
                continue
            pending.remove((name, expr))
            progress = True
        if not progress and failure is not None:
            raise failure
    return done


def read_job(text: str, source: str, inputs: Inputs | None = None, base_dir: Path | None = None) -> Reading:
    """The job file evaluated; HclError for what Nomad refuses (syntax, unset variables, bad calls)."""
    text = heredoc_markers(text)
    tree = _parse(text, source)
    ev = Evaluator(text, source, base_dir if base_dir is not None else Path(source).parent)
    body = _sig(tree)[0]
    variables = _variables(ev, body, inputs or Inputs())
    scope = {"var": variables, "local": _locals(ev, body, variables)}
    out: dict[str, Any] = {}
    reader = BodyReader(ev)
    for item in _items(body):
        if item.data == "block" and _item_name(item) == "job":
            reader.add(out, "job", _labels(item), reader.body(_block_body(item), scope))
    return Reading(out, ev.unknown)
