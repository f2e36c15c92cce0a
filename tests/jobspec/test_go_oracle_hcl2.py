"""check-job's HCL2 evaluation (nomad_plugin/jobspec/hcl2_eval.py) against HashiCorp's own hcl/v2 and cty.

The Go oracle (tests/jobspec/oracle/hcl.go) parses and evaluates the same texts with hclsyntax and cty's
stdlib functions under jobspec2's names; every value, every error summary and detail, and every syntax
diagnostic (with its position) must be Go's. A call a function refuses must be refused; its message is
compared only when Go's is "Error in function call" (cty's argument-type errors name cty's parameters).
A number is compared to within 1e-150 of Go's exact decimal: cty computes in 512-bit binary floating point.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import pytest

from nomad_plugin.jobspec.hcl2_eval import Evaluator, Unknown
from nomad_plugin.jobspec.hcl2_syntax import HclError, parse
from tests.jobspec.oracle.client import GoOracle

VARS: dict[str, Any] = {
    "var": {"mem": "79 GiB", "gpus": 2, "models": ["H800", "A100"], "flag": True, "nothing": None},
    "local": {"m": {"b": 2, "a": "x"}, "objs": [{"n": "a", "v": 1}, {"n": "b", "v": 2}], "f": 1.5},
}

EXPRESSIONS = [
    # operators and precedence
    "1 + 2*3", "(1 + 2) * 3", "10 / 4", "0.1 + 0.2", "1 / 3", "7 % 3", "-7 % 3", "7 % -3", "2.5 % 1", "-var.gpus",
    "0 / 0", "1 < 2", "2 <= 2", "3 > 4", "4 >= 5", "1 == 1", '1 == "1"', "true == true", "null == null", '"a" != "b"',
    "true && false", "!\"x\"", "-\"1\"", '"a" < 1', "true || false", "!var.flag", '"5" + 1', '"2" * "3"', "[1] == [1]", "{a = 1} == {a = 1}",
    '1 + "x"', "true + 1", "!1", '"true" && true', "var.gpus * local.f",
    # conditionals
    'true ? "a" : "b"', 'var.flag ? 1 : "x"', "false ? 1 : 2", 'null ? 1 : 2', '"x" ? 1 : 2', '"true" ? 1 : 2',
    # templates
    '"${var.mem}"', '"mem ${var.mem}!"', '"${var.gpus}"', '"n=${var.gpus}"', '"${1 + 1} GiB"', '"${true}"',
    '"${var.nothing}x"', '"${var.models}x"', '"a%{ if var.flag }yes%{ else }no%{ endif }b"',
    '"%{ for m in var.models }${m},%{ endfor }"', '"%{ for i, m in var.models }${i}=${m} %{ endfor }"',
    '"%{ if "x" }a%{ endif }"', '"%{ if null }a%{ endif }"', '"%{ for o in local.objs }${o.n}%{ endfor }"',
    '"%{ for o in 1 }x%{ endfor }"', '"%{ if true }a%{ else }${local.objs.x}%{ endif }"', "true ? 1 : local.objs.x",
    'false ? local.objs.x : "s"', '"%{ if true }%{ if false }x%{ else }y%{ endif }%{ endif }"', '"%{ if "true" }t%{ endif }"',
        '"$${literal} %%{literal}"', '"tab\\tq\\"u\\u00e9"', '"%{ if !var.flag }x%{ endif }y"',
    # collections, indexes, splats, for expressions
    "[1, 2, 3][1]", "var.models[0]", "var.models.1", "var.models[5]", 'local.m["a"]', "local.m.b", "local.m.zz",
    "local.objs[*].n", "local.objs.*.v", "var.nothing[*]", "var.mem[*]", "local.objs[0].n", "var.models.n",
    "var.nothing.x", '{a = 1, "b" = 2, (var.mem) = 3}', "[for s in var.models : lower(s)]",
    '[for i, s in var.models : "${i}:${s}" if i > 0]', "{for o in local.objs : o.n => o.v}",
    "{for o in local.objs : o.v => o.n}", '{for s in ["a", "a", "b"] : s => s...}', '{for s in ["a", "a"] : s => s}',
    "[for k, v in local.m : k]", "[for x in null : x]", "[for x in 1 : x]", "var.gpus.x",
    # functions
    'format("%d GiB", 79)', 'format("%s-%s", "a", 1)', 'format("%05d|%-4s|%x", 42, "ab", 255)', 'format("%.2f", 1.5)',
    'format("%v %q %t", "a", "b", true)', 'format("%d", 1.5)', 'format("%.3g|%e|%5.1f|%E", 1.5, 1234.5, 2.25, 0.5)', 'format("%s")', 'format("%%")',
    'join(",", var.models)', 'join("-", ["a"], ["b", "c"])', 'split(",", "a,b,,c")', 'lower("ÀB")', 'upper("ab")',
    'concat([1], [2, 3])', "length(var.models)", 'length("héllo")', "length(local.m)", 'lookup(local.m, "a", "d")',
    'lookup(local.m, "z", "d")', 'lookup(local.m, "z")', "merge(local.m, {c = 3})", "element(var.models, 3)",
    'contains(var.models, "A100")', "contains([1, 2], 2)", 'coalesce("", "b")', "coalesce(null, 1)",
    "min(3, 1.5, 2)", "max(3, 1.5, 2)", "range(3)", "range(1, 4)", "range(0, 1, 0.25)", "range(5, 1)",
    'replace("a-b-c", "-", "_")', 'replace("a1b22", "/[0-9]+/", "#")', 'trimspace("  x \\n")', 'jsonencode(local.m)',
    'jsonencode(["<&>", 1.5, true, null])', "abs(-3.5)", "ceil(1.2)", "floor(-1.2)", "keys(local.m)",
    "values(local.m)", "flatten([[1, [2]], 3])", "distinct([1, 1, 2, 1])", 'substr("hello", 1, 3)',
    'substr("hello", -3, -1)', 'title("hello world")', 'strrev("abc")', 'reverse("abc")', 'chomp("x\\n\\n")',
    'indent(2, "a\\nb")', 'index(var.models, "A100")', "slice([1, 2, 3], 1, 3)", 'zipmap(["a", "b"], [1, 2])',
    'compact(["a", "", "b"])', 'parseint("ff", 16)', "signum(-4)", "pow(2, 10)", "upper(1)", 'split("", "abc")',
    'trim("--x--", "-")', 'trimprefix("abc", "a")', 'trimsuffix("abc", "c")', 'coalescelist([], [1])',
    'lookup(local.m, "a", "d")', "upper(1, 2)", 'index(["a", "b"], 1)', 'coalesce(1, "a")', 'contains([1, 2], "1")',
    '{for s in ["a"] : s => s if s}', '[for s in ["a"] : s if "x"]', 'var.models["x"]', "local.m[0]", '"s".x',
    "element([], 1)", "max()", 'format("%d", "x")', 'replace("aaa", "", "b")', '"${[1]}"', "keys({})",
    "chunklist([1, 2, 3], 2)", "reverse([1])", "length({})",
    'format("%g", 1.5)', "nosuchfunction(1)", "tostring(1)", "concat(var.models...)", 'format("%s", var.models...)',
]  # fmt: skip

#: check-job cannot tell a map from an object (cty's length refuses an object): it says it cannot tell.
NOT_EVALUATED = {"length(local.m)", "length({})", 'format("%g", 1.5)'}

SYNTAX = [
    'job "a" {\n}\n',
    'job "vllm-${JOB_UUID}" {\n}\n',
    'job "a" {\n  group "g-%{ if true }x%{ endif }" {\n  }\n}\n',
    'job "a" {\n  constraint { attribute = "x" value = "y" }\n}\n',
    'job "a" {\n  constraint { attribute = "x" }\n}\n',
    'job "a" {\n  a = 1 b = 2\n}\n',
    'job "a" {\n  group "g" {\n  } x = 1\n}\n',
    'job "a" {\n  c { inner { a = 1 } }\n}\n',
    'job "a" {\n  c { inner "x" { a = 1 } }\n}\n',
    'job "a"\n{\n}\n',
    'job "a" {\n  c { a = 1\n  }\n}\n',
    'job "a" {\n  g {\n  }}\n',
    'job "a" {\n  a = 1 }\n',
    'job "j" {\n group "g" {\n  task "t" {\n   resources {\n    device "gpu" { count = 0 }\n}}}}',
    'job "a" {\n  group "g" {\n    count = 1 # comment\n  } // done\n}',
    'job "a" {\n  c { a = 1 }\n  d {}\n  e {\n  }\n}',
]


def _json(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def _cty(value: Any) -> Any:
    """A JSON value as the evaluator holds it: numbers are Decimals."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_cty(v) for v in value]
    if isinstance(value, dict):
        return {k: _cty(v) for k, v in value.items()}
    return value


def _python(expression: str) -> tuple[bool, Any]:
    text = f"x = {expression}\n"
    node = next(hcl2.parses_to_tree(text).find_data("attribute")).children[-1]
    try:
        return True, Evaluator(text, "expr.hcl", Path()).value(node, _cty(VARS))
    except HclError as exc:
        return False, f"{exc.summary}; {exc.detail}"


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_expression_matches_go(go_oracle: GoOracle, expression: str) -> None:
    go = go_oracle.one(op="hcl_eval", s=expression, vars=VARS)
    ok, value = _python(expression)
    assert isinstance(value, Unknown) == (expression in NOT_EVALUATED), value
    if expression in NOT_EVALUATED:
        return
    if not go["ok"]:
        summary_detail = go["diags"][0].split(": ", 1)[1]
        assert not ok, f"Go refuses {expression!r} ({summary_detail}); check-job gave {value!r}"
        calls = ("Invalid function argument", "Not enough function arguments", "Too many function arguments")
        if not summary_detail.startswith(calls) or value.startswith(calls):
            assert value == summary_detail
        return
    assert ok, f"Go gives {go['value']!r} for {expression!r}; check-job refused it: {value}"
    if "text" in go:
        assert isinstance(value, Decimal)
        want = Decimal(go["text"])
        assert abs(value - want) <= abs(want) * Decimal("1e-150"), (value, want)
    else:
        assert _json(value) == go["value"]
        assert (go["type"] == "string") == isinstance(value, str)
        assert (go["type"] == "bool") == isinstance(value, bool)


@pytest.mark.parametrize("text", SYNTAX)
def test_syntax_diagnostic_matches_go(go_oracle: GoOracle, text: str) -> None:
    go = go_oracle.one(op="hcl_syntax", s=text)["diags"]
    try:
        parse(text, "job.hcl")
    except HclError as exc:
        assert go, f"Go accepts {text!r}; check-job refused it: {exc.text('job.hcl')}"
        assert exc.text("job.hcl") == go[0]
        return
    assert not go, f"Go refuses {text!r} ({go[0]}); check-job accepted it"
