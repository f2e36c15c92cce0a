"""A job file's HCL2 read as Nomad's ``jobspec2`` reads it, before decoding.

``jobspec2/types.config.go`` (``decodeBody``) reads ``variable``/``variables`` blocks, takes their values
from defaults, ``NOMAD_VAR_*``, ``-var-file`` and ``-var`` (``types.variables.go``,
``collectInputVariableValues``: the last wins; ``nomad job run`` is ``-hcl2-strict``, so a value for an
undeclared variable is an error, and every declared variable must end with a value), evaluates ``locals``
(retrying those that name a later one), expands ``dynamic`` blocks (HCL's ``dynblock``) and evaluates
every expression (``hcl2_eval``). The result is python-hcl2's ``loads`` form, so ``parse.py``'s decoder
reads it as before; what is not evaluated stays an ``Unknown`` (its text ``${...}``) and is listed, so
check-job says it cannot tell instead of deciding on a partial reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from nomad_plugin.jobspec.hcl2_eval import Evaluator, Unknown, kind_of
from nomad_plugin.jobspec.hcl2_functions import FunctionError, to_bool, to_number, to_string
from nomad_plugin.jobspec.hcl2_syntax import (
    HclError,
    Node,
    attributes,
    block_body,
    block_labels,
    body_items,
    header,
    heredoc_markers,
    item_name,
    name_of,
    parse,
    sig,
)

_TYPES = {"string": str, "number": Decimal, "bool": bool}


_VAR_PREFIX = "NOMAD_VAR_"


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


def _quote(text: str) -> str:
    """The quoted HCL literal ``util.hcl.unquote`` turns back into ``text``."""
    body = json.dumps(text, ensure_ascii=False)[1:-1].replace("${", "$${").replace("%{", "%%{")
    return f'"{body}"'


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
        for item in body_items(body):
            name = item_name(item)
            if item.data == "attribute":
                out[name] = loads_form(self.ev.value(sig(item)[-1], scope))
            elif name == "dynamic":
                self.dynamic(item, scope, out)
            else:
                self.add(out, name, block_labels(item), self.body(block_body(item), scope))
        return out

    @staticmethod
    def add(out: dict[str, Any], kind: str, labels: list[str], content: dict[str, Any]) -> None:
        content["__is_block__"] = True
        for label in reversed(labels):
            content = {_quote(label): content}
        out.setdefault(kind, []).append(content)

    def dynamic(self, block: Node, scope: dict[str, Any], out: dict[str, Any]) -> None:
        labels = block_labels(block)
        if len(labels) != 1:
            raise HclError("Extraneous label for dynamic" if labels else "Missing name for dynamic", "A dynamic block must have exactly one label: the type of the block to generate.", block)  # fmt: skip
        kind, body = labels[0], block_body(block)
        attrs = attributes(body)
        contents = [b for b in body_items(body) if b.data == "block" and item_name(b) == "content"]
        if "for_each" not in attrs or len(contents) != 1:
            missing = 'argument "for_each"' if "for_each" not in attrs else 'a "content" block'
            raise HclError("Missing required argument" if "for_each" not in attrs else "Missing content block", f"A dynamic block requires {missing}.", block)  # fmt: skip
        iterator = kind
        if "iterator" in attrs:
            root = self.ev.runtime_root(attrs["iterator"], {})
            if not root:
                raise HclError("Invalid dynamic iterator name", "Dynamic iterator must be a single variable name.", attrs["iterator"])  # fmt: skip
            iterator = root
        each = self.ev.value(attrs["for_each"], scope)
        if isinstance(each, Unknown):
            self.ev.unknown.append(f'{self.ev.source}: dynamic "{kind}" is not expanded: its for_each is not evaluated')
            return
        if each is None or not isinstance(each, (list, dict)):
            reason = (
                "Cannot use a null value in for_each."
                if each is None
                else f"Cannot use a {kind_of(each)} value in for_each. An iterable collection is required."
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
                    raise HclError("Invalid dynamic block label", "Cannot use this value as a dynamic block label: a list of strings is required.", attrs["labels"])  # fmt: skip
                names = [to_string(v) for v in raw]
            self.add(out, kind, names, self.body(block_body(contents[0]), inner))


def _type_spec(node: Node) -> Any:
    """``typeexpr``: string, number, bool, any, list(T), set(T), map(T); other constraints are refused."""
    kids = sig(node)
    inner = kids[0] if node.data == "expr_term" else node
    if inner.data == "identifier" and name_of(inner) in (*_TYPES, "any"):
        return name_of(inner)
    if inner.data == "function_call":
        name = name_of(sig(inner)[0])
        args = sig(sig(inner)[-1]) if sig(inner)[-1].data == "arguments" else []
        if name in ("list", "set", "map") and len(args) == 1:
            return (name, _type_spec(args[0]))
        if name in ("object", "tuple"):
            return ("unsupported", name)
    raise HclError("Invalid type specification", "A type specification is either a primitive type keyword (bool, number, string) or a complex type constructor call, like list(string).", node)  # fmt: skip


@dataclass
class _Variable:
    name: str
    spec: Any
    node: Node
    values: list[Any] = field(default_factory=list)
    froms: list[str] = field(default_factory=list)  # where each value came from, in Nomad's words
    exprs: list[Any] = field(default_factory=list)  # each value's expression (None: from -var or the environment)


_INCOMPATIBLE = "The {what} for {name} is not compatible with the variable's type constraint: {err}."


def _assign(var: _Variable, value: Any, origin: str, summary: str, detail: str, node: Any, source: str = "") -> None:
    """One value for a variable, converted to its type; ``origin`` is Nomad's word for where it came from."""
    if isinstance(var.spec, tuple) and var.spec[0] == "unsupported":
        why = f"variable {var.name!r}: check-job does not evaluate {var.spec[1]}(...) variable types"
        value = Unknown("${var." + var.name + "}", why)
    elif var.spec is not None:
        try:
            value = convert(value, var.spec)
        except FunctionError as exc:
            raise HclError(summary, detail.format(name=var.name, err=exc), node, source) from None
    var.values.append(value)
    var.froms.append(origin)
    var.exprs.append(node)


def _variables(ev: Evaluator, body: Node, inputs: Inputs) -> dict[str, Any]:
    """``decodeInputVariables`` and ``collectInputVariableValues``: defaults, env, var files, -var."""
    declared: dict[str, _Variable] = {}
    for item in body_items(body):
        kind = item_name(item)
        if item.data != "block" or kind not in ("variable", "variables"):
            continue
        pairs: list[tuple[str, Node | None, Any]] = []
        if kind == "variables":
            pairs = [(n, a, None) for n, a in attributes(block_body(item)).items()]
        if kind == "variable":
            (name,) = block_labels(item) or [""]
            attrs = attributes(block_body(item))
            pairs = [(name, attrs.get("default"), _type_spec(attrs["type"]) if "type" in attrs else None)]
        for name, default, spec in pairs:
            if name in declared:
                raise HclError("Duplicate variable", f"Duplicate {name} variable definition found.", item)
            var = declared[name] = _Variable(name, spec, item)
            if default is not None:
                detail = "This default value is not compatible with the variable's type constraint: {err}."
                _assign(var, ev.value(default, {}), "default", "Invalid default value for variable", detail, default)
    for key, text in inputs.env.items():
        name, source = key[len(_VAR_PREFIX) :], f"<value for var.{key[len(_VAR_PREFIX) :]} from env>"
        if key.startswith(_VAR_PREFIX) and name in declared:
            detail = _INCOMPATIBLE.replace("{what}", "value")
            _assign(declared[name], _cli_value(declared[name], text, source), "env", "Invalid value for variable", detail, None, source)  # fmt: skip
    for file_name, text in inputs.files:
        if file_name.endswith(".json"):  # HCL's JSON syntax: an object of values, written here as HCL
            text = _json_var_file(text, file_name)
        file_ev = Evaluator(text, file_name, Path())
        for item in body_items(sig(parse(text, file_name))[0]):
            if item.data == "block":
                raise HclError("Variable declaration in a .var file", f'A .var file is used to assign values to variables that have already been declared in job files, not to declare new variables. To declare variable "{item_name(item)}", place this block in one of your job files\n\nTo set a value for this variable in {file_name}, use the definition syntax instead:\n    {block_labels(item)[0] if block_labels(item) else ""} = <value>', item, file_name)  # fmt: skip
            name, expr = item_name(item), sig(item)[-1]
            if name not in declared:  # an error: `nomad job run` is -hcl2-strict by default
                raise HclError("Undefined variable", f'A "{name}" variable was set but was not found in known variables. To declare variable "{name}", place this block in your job files', item, file_name)  # fmt: skip
            detail = _INCOMPATIBLE.replace("{what}", "value")
            _assign(declared[name], file_ev.value(expr, {}), "varfile", "Invalid value for variable", detail, expr, file_name)  # fmt: skip
    for arg in inputs.args:
        name, sep, text = arg.partition("=")
        if sep and name not in declared:
            raise HclError("Undefined -var variable", f'A "{name}" variable was passed in the command line but was not found in known variables. To declare variable "{name}", place this block in your job file', None, "-var")  # fmt: skip
        if sep:
            source, detail = (
                f"<value for var.{name} from arguments>",
                _INCOMPATIBLE.replace("{what}", "received arg value"),
            )
            _assign(declared[name], _cli_value(declared[name], text, source), "cmd", "Invalid argument value for -var variable", detail, None, source)  # fmt: skip
    for var in declared.values():
        if not var.values:
            raise HclError(f'Unset variable "{var.name}"', "A used variable must be set or have a default value; see https://developer.hashicorp.com/nomad/docs/reference/hcl2/variables  for details.", header(var.node))  # fmt: skip
        ev.unknown.extend(v.why for v in var.values[-1:] if isinstance(v, Unknown))
        _validate(ev, var)
    return {name: var.values[-1] for name, var in declared.items()}


def _validate(ev: Evaluator, var: _Variable) -> None:
    """``Variable.validateValue``: each ``validation`` block's condition on the value that won."""
    for block in (b for b in body_items(block_body(var.node)) if b.data == "block" and item_name(b) == "validation"):
        attrs = attributes(block_body(block))
        if "condition" not in attrs or "error_message" not in attrs:
            raise HclError("Missing required argument", "The argument \"condition\" and \"error_message\" are required.", block)  # fmt: skip
        result = ev.value(attrs["condition"], {"var": {var.name: var.values[-1]}})
        if isinstance(result, Unknown):
            continue
        if result is None:
            raise HclError("Invalid variable validation result", "Validation condition expression must return either true or false, not null.", attrs["condition"])  # fmt: skip
        if not to_bool(result):
            span = header(block)
            where = f"{ev.source}:{span.line},{span.column}-{span.end_column}"
            message = ev.value(attrs["error_message"], {})
            raise HclError(f"Invalid value for {var.froms[-1]} variable", f"{message}\n\nThis was checked by the validation rule at {where}.", var.exprs[-1] or span)  # fmt: skip


def _json_var_file(text: str, file_name: str) -> str:
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise HclError("", f"{file_name}: not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise HclError("", f"{file_name}: a JSON variables file holds one object")
    return "".join(f"{name} = {json.dumps(value)}\n" for name, value in values.items())


def _cli_value(var: _Variable, text: str, source: str) -> Any:
    """``expressionFromVariableDefinition``: a string, number or untyped variable takes the text as it is;
    any other type reads it as an HCL expression."""
    if var.spec in (None, "string", "number"):
        return text
    tree = parse(f"v = {text}\n", source)
    return Evaluator(f"v = {text}\n", source, Path()).value(sig(body_items(sig(tree)[0])[0])[-1], {})


def _locals(ev: Evaluator, body: Node, variables: dict[str, Any]) -> dict[str, Any]:
    """``evaluateLocalVariables``: each local in turn; one that fails waits for the others (a local may
    name a later one), and the last failure is the error."""
    pending = [
        (n, e)
        for item in body_items(body)
        if item.data == "block" and item_name(item) == "locals"
        for n, e in attributes(block_body(item)).items()
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
    try:
        return _read_job(text, source, inputs, base_dir)
    except RecursionError:
        raise HclError("", f"{source}: check-job cannot tell: expressions nested deeper than it evaluates") from None


def _read_job(text: str, source: str, inputs: Inputs | None, base_dir: Path | None) -> Reading:
    text = heredoc_markers(text)
    tree = parse(text, source)
    ev = Evaluator(text, source, base_dir if base_dir is not None else Path(source).parent)
    body = sig(tree)[0]
    _top_level(body)
    variables = _variables(ev, body, inputs or Inputs())
    scope = {"var": variables, "local": _locals(ev, body, variables)}
    out: dict[str, Any] = {}
    reader = BodyReader(ev)
    for item in body_items(body):
        if item.data == "block" and item_name(item) == "job":
            if out:
                first = header(next(b for b in body_items(body) if b.data == "block" and item_name(b) == "job"))
                where = f"{source}:{first.line},{first.column}-{first.end_column}"
                raise HclError("Duplicate job block", f'Only one block of type "job" is allowed. Previous definition was at {where}.', header(item))  # fmt: skip
            reader.add(out, "job", block_labels(item), reader.body(block_body(item), scope))
    return Reading(out, ev.unknown)


def _top_level(body: Node) -> None:
    """``jobConfigSchema``: only ``variable``, ``variables``, ``locals`` and ``job`` blocks."""
    for item in body_items(body):
        name = item_name(item)
        if item.data == "attribute":
            raise HclError(
                "Unsupported argument", f'An argument named "{name}" is not expected here.', item.children[0]
            )
        if name not in ("variable", "variables", "locals", "job"):
            raise HclError(
                "Unsupported block type", f'Blocks of type "{name}" are not expected here.', item.children[0]
            )
