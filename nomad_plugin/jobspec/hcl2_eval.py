"""HCL2 expressions evaluated as HashiCorp's ``hclsyntax`` and cty evaluate them for Nomad's jobspec2.

Operators, conditionals, ``for`` expressions, splats, indexes, templates (``${}``, ``%{if}``, ``%{for}``,
heredocs) and calls of ``jobspec2/functions.go``'s functions (``hcl2_functions``). Values: ``str``,
``Decimal`` (cty's numbers), ``bool``, ``None``, lists and dicts. A name that is neither ``var``,
``local`` nor an iterator is one of Nomad's runtime values (``node``, ``attr``, ``meta``, ``device``,
``NOMAD_*``): jobspec2's ``UndefinedVariable`` (``types.config.go``) makes it its own ``${...}`` text.
What this module does not evaluate is an ``Unknown``, recorded with its position, never a guess.
"""

from __future__ import annotations

import inspect
import re
from decimal import Decimal, localcontext
from pathlib import Path
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
from nomad_plugin.jobspec.hcl2_syntax import HclError, Node, body_items, name_of, sig
from nomad_plugin.util.hcl import unquote


class Unknown(str):
    """A value check-job does not evaluate: its text is ``${<source>}``, ``why`` says what is missing."""

    why: str

    def __new__(cls, text: str, why: str) -> Unknown:
        made = super().__new__(cls, text)
        made.why = why
        return made


def kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    return "tuple" if isinstance(value, list) else "object" if isinstance(value, dict) else "null"


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
            kids = sig(node)
            if node.data == "index_expr_term" and kids[1].data == "braces_index":
                key = sig(kids[1])[0]
                lit = sig(key)[0] if key.data == "expr_term" and len(key.children) == 1 else key
                plain = lit.data == "string" and all(isinstance(p.children[0], Token) for p in sig(lit))
                if not (plain or lit.data in ("int_lit", "float_lit", "literal_value")):
                    return ""
            if len(kids) != (1 if node.data == "expr_term" else 2) or (
                node.data == "expr_term" and any(isinstance(c, Token) and c.type == "LPAR" for c in node.children)
            ):
                return ""
            node = kids[0]
        name = name_of(node) if node.data == "identifier" else ""
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
        kids = sig(node)
        if data == "expr_term":
            return self.value(kids[0], scope)
        if data in ("int_lit", "float_lit"):
            return Decimal(str(node.children[0]))
        if data == "literal_value":
            return {"true": True, "false": False, "null": None}[str(node.children[0])]
        if data == "identifier":
            return scope[name_of(node)] if name_of(node) in scope else self.value(node, scope)
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
                for op in sig(kids[1]):
                    item = self.step(item, op, scope)
                out.append(item)
            return out
        if data in ("for_tuple_expr", "for_object_expr"):
            return self.for_expr(node, scope)
        if data == "conditional":
            return self.conditional(kids, scope)
        if data == "binary_op":
            operator, right = kids[1].children[0], sig(kids[1])[-1]
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
                    raise HclError("Operation failed", "Error during operation: can't divide zero by zero or infinity by infinity.", node)  # fmt: skip
                return self.not_evaluated(node, f"{self.src(node)} is infinite")
            return {"+": a + b, "-": a - b, "*": a * b}[op] if op in "+-*" else (a / b if op == "/" else a % b)

    def conditional(self, kids: list[Node], scope: dict[str, Any]) -> Any:
        cond = self.value(kids[0], scope)
        if isinstance(cond, Unknown):
            return cond
        chosen = self.truth(cond, kids[0])
        result = self.value(kids[1] if chosen else kids[2], scope)
        if kind_of(result) in ("number", "bool"):  # cty unifies the two results' types: a string wins
            other = self.quietly(kids[2] if chosen else kids[1], scope)  # its errors are not reported
            return to_string(result) if isinstance(other, str) and not isinstance(other, Unknown) else result
        return result

    @staticmethod
    def truth(cond: Any, node: Node) -> bool:
        """A condition's value (a conditional's or a template ``%{ if }``'s)."""
        if cond is None:
            raise HclError("Null condition", "The condition value is null. Conditions must either be true or false.", node)  # fmt: skip
        try:
            return to_bool(cond)
        except FunctionError:
            raise HclError("Incorrect condition type", "The condition expression must be of type bool.", node) from None  # fmt: skip

    def quietly(self, node: Node, scope: dict[str, Any]) -> Any:
        """A value whose errors and unknowns do not count (the branch a condition did not choose)."""
        mark = len(self.unknown)
        try:
            return self.value(node, scope)
        except HclError:
            return None
        finally:
            del self.unknown[mark:]

    def step(self, base: Any, op: Node, scope: dict[str, Any]) -> Any:
        """One ``.name``, ``[key]`` or ``.0`` applied to a value (hcl's traversal rules)."""
        if isinstance(base, Unknown):
            return base
        if op.data == "get_attr":
            key: Any = name_of(sig(op)[0])
            if isinstance(base, list):
                raise HclError("Unsupported attribute", "This value does not have any attributes.", op)
            if base is None:
                raise HclError("Attempt to get attribute from null value", "This value is null, so it does not have any attributes.", op)  # fmt: skip
            if not isinstance(base, dict):
                raise HclError("Unsupported attribute", f"Can't access attributes on a primitive-typed value ({kind_of(base)}).", op)  # fmt: skip
            if key not in base:
                raise HclError("Unsupported attribute", f'This object does not have an attribute named "{key}".', op)
            return base[key]
        key = Decimal(str(op.children[1])) if op.data == "short_index" else self.value(sig(op)[0], scope)
        if isinstance(key, Unknown):
            return key
        if base is None:
            raise HclError("Attempt to index null value", "This value is null, so it does not have any indices.", op)
        missing = "The given key does not identify an element in this collection value"
        if isinstance(base, dict) and isinstance(key, Decimal):
            raise HclError("Invalid index", f"{missing}. An object only supports looking up attributes by name, not by numeric index.", op)  # fmt: skip
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
            key_node, value_node = sig(elem)
            inner = sig(key_node)[0]
            bare = inner.data == "keyword" or (
                inner.data == "expr_term" and sig(inner)[0].data == "identifier" and len(inner.children) == 1
            )
            key = (
                name_of(sig(inner)[0])
                if bare and inner.data == "expr_term"
                else name_of(inner)
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
        kids = sig(node)
        name = name_of(kids[0])
        if len(kids) > 1 and kids[1].data == "identifier":
            return self.not_evaluated(node, f"check-job does not implement function {self.src(node).split('(')[0]}")
        arg_nodes = sig(kids[-1]) if kids[-1].data == "arguments" else []
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
                raise HclError("Invalid expanding argument value", "The expanding argument (indicated by ...) must be of a tuple, list, or set type.", arg_nodes[-1])  # fmt: skip
            args = [*args[:-1], *args[-1]]
        for arg in args:
            if isinstance(arg, Unknown) or (isinstance(arg, list) and any(isinstance(a, Unknown) for a in arg)):
                return arg if isinstance(arg, Unknown) else next(a for a in arg if isinstance(a, Unknown))
        try:
            return self.functions[name](*args)
        except NotImplementedError as exc:
            return self.not_evaluated(node, f"check-job does not evaluate {name}(): {exc}")
        except (IndexError, KeyError, AttributeError, RecursionError) as exc:  # a reading check-job lacks
            return self.not_evaluated(node, f"check-job does not evaluate this call of {name}() ({type(exc).__name__})")
        except TypeError:
            raise _arity(name, self.functions[name], len(args), node) from None
        except (FunctionError, ValueError, ArithmeticError, re.error) as exc:
            raise HclError("Error in function call", f'Call to function "{name}" failed: {exc}.', node) from None

    def for_expr(self, node: Node, scope: dict[str, Any]) -> Any:
        kids = sig(node)
        intro, body = kids[0], kids[1:]
        names = [name_of(n) for n in sig(intro) if n.data == "identifier"]
        collection = self.value(sig(intro)[-1], scope)
        if isinstance(collection, Unknown):
            return collection
        if collection is None:
            raise HclError("Iteration over null value", "A null value cannot be used as the collection in a 'for' expression.", intro)  # fmt: skip
        if isinstance(collection, dict):
            pairs = [(k, collection[k]) for k in sorted(collection)]
        elif isinstance(collection, list):
            pairs = [(Decimal(i), v) for i, v in enumerate(collection)]
        else:
            raise HclError("Iteration over non-iterable value", f"A value of type {kind_of(collection)} cannot be used as the collection in a 'for' expression.", intro)  # fmt: skip
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
                keep = self.value(sig(cond)[0], inner)
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
                raise HclError("Duplicate object key", f"Two different items produced the key \"{k}\" in this 'for' expression. If duplicates are expected, use the ellipsis (...) after the value expression to enable grouping by key.", body[0])  # fmt: skip
            else:
                out_map[k] = v
        return out_list if node.data == "for_tuple_expr" else out_map

    # --- templates ------------------------------------------------------------------------------

    def template(self, parts: list[Any], scope: dict[str, Any]) -> Any:
        """A quoted template's parts: literal text, ``${...}``, ``%{if}``/``%{for}`` directives."""
        interps = [p for p in parts if isinstance(p, Tree) and p.data == "interpolation"]
        if len(parts) == 1 and interps:  # "${x}" alone is x itself, not converted to a string
            return self.value(sig(interps[0])[0], scope)
        return self.sequence(parts, scope)

    def sequence(self, parts: list[Any], scope: dict[str, Any]) -> Any:
        """Template parts in order; a directive's body is found by nesting and evaluated only as chosen."""
        chunks: list[str] = []
        unknown: Unknown | None = None
        i = 0
        while i < len(parts):
            part, i = parts[i], i + 1
            kind = part.data if isinstance(part, Tree) else "text"
            if kind == "text":
                chunks.append(unquote('"' + str(part) + '"') if part.type == "STRING_CHARS" else str(part)[1:])
                continue
            if any(isinstance(c, Token) and c.type == "STRIP_MARKER" for c in part.children):
                return self.not_evaluated(part, "check-job does not evaluate a template's ~ strip markers")
            if kind == "interpolation":
                unknown = unknown or self.interpolated(self.value(sig(part)[0], scope), part, chunks)
            elif kind == "template_if_start":
                middle = _closing(parts, i, ("template_else", "template_endif"))
                end = (
                    _closing(parts, middle + 1, ("template_endif",))
                    if middle < len(parts) and parts[middle].data == "template_else"
                    else middle
                )
                cond = self.value(sig(part)[0], scope)
                if isinstance(cond, Unknown):
                    unknown = unknown or cond
                else:
                    body = parts[i:middle] if self.truth(cond, part) else parts[middle + 1 : end]
                    unknown = unknown or self.interpolated(self.sequence(body, scope), part, chunks)
                i = end + 1
            elif kind == "template_for_start":
                end = _closing(parts, i, ("template_endfor",))
                names = [name_of(n) for n in sig(part) if n.data == "identifier"]
                collection = self.value(sig(part)[-1], scope)
                if isinstance(collection, Unknown):
                    unknown = unknown or collection
                elif not isinstance(collection, (list, dict)):
                    raise HclError("Iteration over non-iterable value", f"A value of type {kind_of(collection)} cannot be used as the collection in a 'for' expression.", part)  # fmt: skip
                else:
                    pairs = (
                        sorted(collection.items())
                        if isinstance(collection, dict)
                        else [(Decimal(k), v) for k, v in enumerate(collection)]
                    )
                    for key, item in pairs:
                        bound = dict(zip(names[::-1], [item, key], strict=False))
                        text = self.sequence(parts[i:end], {**scope, **bound})
                        unknown = unknown or self.interpolated(text, part, chunks)
                i = end + 1
            else:
                raise HclError("Unexpected template directive", "This directive has no opening directive before it.", part)  # fmt: skip
        return unknown if unknown is not None else "".join(chunks)

    def interpolated(self, value: Any, node: Node, chunks: list[str]) -> Unknown | None:
        if isinstance(value, Unknown):
            return value
        if value is None:
            raise HclError("Invalid template interpolation value", "The expression result is null. Cannot include a null value in a string template.", node)  # fmt: skip
        if isinstance(value, (list, dict)):
            raise HclError("Invalid template interpolation value", "Cannot include the given value in a string template: string required.", node)  # fmt: skip
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
        string = sig(sig(body_items(tree.children[0])[0])[-1])[0]  # x = "..." -> its string
        sub = Evaluator(f"x = {_requote(body)}\n", self.source, Path())
        sub.functions, sub.unknown = self.functions, self.unknown
        try:
            return sub.template([c for p in string.children if isinstance(p, Tree) for c in p.children], scope)
        except HclError as exc:
            raise HclError(exc.summary, exc.detail, node) from None


def _closing(parts: list[Any], i: int, kinds: tuple[str, ...]) -> int:
    """The index of the directive that closes (or splits) the one opened before ``i``, nesting counted."""
    depth = 0
    for j in range(i, len(parts)):
        kind = parts[j].data if isinstance(parts[j], Tree) else "text"
        if depth == 0 and kind in kinds:
            return j
        depth += (kind in ("template_if_start", "template_for_start")) - (kind in ("template_endif", "template_endfor"))
    return len(parts)


def _arity(name: str, function: Any, given: int, node: Node) -> HclError:
    """hclsyntax's errors for a call with the wrong number of arguments."""
    params = [p for p in inspect.signature(function).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    if given < len(params):
        return HclError("Not enough function arguments", f'Function "{name}" expects {len(params)} argument(s). Missing value for "{params[given].name}".', node)  # fmt: skip
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
