"""jobspec2's own behaviour around the expression language, from Nomad's ``jobspec2/parse_test.go`` and
``types.config.go``/``types.variables.go``: runtime references kept as text, variable precedence and
errors, locals in any order, dynamic blocks, heredocs. (Expression values and syntax errors are compared
with HashiCorp's Go code in test_go_oracle_hcl2.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nomad_plugin.jobspec.hcl2_eval import Unknown
from nomad_plugin.jobspec.hcl2_job import Inputs, read_job
from nomad_plugin.jobspec.hcl2_syntax import HclError
from nomad_plugin.util.hcl import labelled, plain


def job_attrs(text: str, inputs: Inputs | None = None, base_dir: Path | None = None) -> dict[str, Any]:
    reading = read_job(text, "job.hcl", inputs, base_dir)
    ((_, body),) = labelled(reading.body["job"])
    return {k: v if isinstance(v, Unknown) else plain(v) for k, v in body.items() if isinstance(k, str)}


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "foo-${BAR}",
        "foo-${attr.network.dev-us-east1-relay-vpc.external-ip.0}",
        '${env["BLAH"]}',
        '${mixed-indexing.0[3]["FOO"].5}',
        'with spaces ${   root.  field[  "FOO"].5  }',
    ],
)  # TestParse_UndefinedVariables
def test_undefined_variables_keep_their_text(value: str) -> None:
    assert job_attrs(f'job "example" {{\n  region = "{value}"\n}}\n')["region"] == value


def test_unquoted_and_nested_runtime_references() -> None:
    attrs = job_attrs(
        'job "example" {\n  region = meta.mytest\n  a = upper(node.class)\n  b = "${upper(node.class)}-${ meta.x }"\n'
        "  c = (attr.kernel.name)\n}\n"
    )
    assert attrs["region"] == "${meta.mytest}"  # TestParse_UndefinedVariables "unquoted"
    assert attrs["a"] == "${NODE.CLASS}" and attrs["b"] == "${NODE.CLASS}-${ meta.x }"
    assert attrs["c"] == "${attr.kernel.name}"


VARIABLE = 'variable "n" {\n  type = number\n  default = 1\n}\njob "j" {\n  n = var.n\n}\n'


def test_variable_values_in_nomads_order() -> None:
    assert job_attrs(VARIABLE)["n"] == 1
    env = {"NOMAD_VAR_n": "2", "NOMAD_VAR_other": "x", "N": "9"}
    assert job_attrs(VARIABLE, Inputs(env=env))["n"] == 2
    assert job_attrs(VARIABLE, Inputs(env=env, files=[("v.hcl", "n = 3\n")]))["n"] == 3
    assert job_attrs(VARIABLE, Inputs(["n=4"], [("v.hcl", "n = 3\n")], env))["n"] == 4
    assert job_attrs(VARIABLE, Inputs(files=[("v.json", '{"n": 5}')]))["n"] == 5
    # TestParse_UnknownVariables: -var region_var=aug over a `variables` block's default
    text = 'variables {\n  region_var = "default"\n}\njob "example" {\n  region = var.region_var\n}\n'
    assert job_attrs(text, Inputs(["region_var=aug"]))["region"] == "aug"


@pytest.mark.parametrize(
    ("text", "inputs", "message"),
    [
        ('variable "region_var" {}\njob "example" {\n  region = var.region_var\n}\n', None, 'Unset variable "region_var"'),
        (VARIABLE, Inputs(["n=x"]), "Invalid argument value for -var variable; The received arg value for n is not compatible with the variable's type constraint: a number is required."),
        (VARIABLE, Inputs(env={"NOMAD_VAR_n": "x"}), "Invalid value for variable; The value for n is not compatible"),
        (VARIABLE, Inputs(files=[("v.hcl", 'variable "n" {}\n')]), "Variable declaration in a .var file"),
        ('variable "n" {\n  type = number\n  default = "x"\n}\njob "j" {\n}\n', None, "Invalid default value for variable; This default value is not compatible with the variable's type constraint: a number is required."),
        ('variable "l" {\n  type = list(string)\n  default = "x"\n}\njob "j" {\n}\n', None, "list of string required"),
        ('variable "a" {\n  default = 1\n}\nvariable "a" {\n  default = 2\n}\njob "j" {\n}\n', None, "Duplicate variable; Duplicate a variable definition found."),
        ('variable "n" {\n  default = 5\n  validation {\n    condition = var.n < 4\n    error_message = "Too many."\n  }\n}\njob "j" {\n}\n', None, "job.hcl:2,13-14: Invalid value for default variable; Too many.\n\nThis was checked by the validation rule at job.hcl:3,3-13."),
        ('variable "n" {\n  default = 5\n  validation {\n    condition = var.n < 9\n    error_message = "Too many."\n  }\n}\njob "j" {\n}\n', Inputs(["n=10"]), "Invalid value for cmd variable; Too many."),
        ('job "a" {\n}\njob "b" {\n}\n', None, 'job.hcl:3,1-8: Duplicate job block; Only one block of type "job" is allowed. Previous definition was at job.hcl:1,1-8.'),
        ('plugin "x" {\n}\njob "j" {\n}\n', None, 'job.hcl:1,1-7: Unsupported block type; Blocks of type "plugin" are not expected here.'),
        ('region = "x"\njob "j" {\n}\n', None, 'job.hcl:1,1-7: Unsupported argument; An argument named "region" is not expected here.'),
        (VARIABLE, Inputs(["m=1"]), 'Undefined -var variable; A "m" variable was passed in the command line but was not found in known variables.'),
        (VARIABLE, Inputs(files=[("v.hcl", "m = 1\n")]), 'v.hcl:1,1-6: Undefined variable; A "m" variable was set but was not found'),
    ],
)  # fmt: skip
def test_variable_errors_are_nomads(text: str, inputs: Inputs | None, message: str) -> None:
    with pytest.raises(HclError) as err:
        read_job(text, "job.hcl", inputs)
    assert message in err.value.text("job.hcl")


def test_typed_variables_convert_and_cli_values_of_other_types_are_expressions() -> None:
    text = 'variable "l" {\n  type = list(number)\n  default = ["1", 2]\n}\njob "j" {\n  l = var.l\n}\n'
    assert job_attrs(text)["l"] == [1, 2]
    assert job_attrs(text, Inputs(["l=[3, 4]"]))["l"] == [3, 4]
    text = 'variable "s" {\n  type = string\n}\njob "j" {\n  s = var.s\n}\n'
    assert job_attrs(text, Inputs(["s=[3, 4]"]))["s"] == "[3, 4]"  # a string variable takes the text as it is


def test_locals_may_name_later_locals_and_a_cycle_is_an_error() -> None:
    text = 'locals {\n  a = "${local.b}-a"\n  b = upper("b")\n}\njob "j" {\n  a = local.a\n}\n'
    assert job_attrs(text)["a"] == "B-a"
    with pytest.raises(HclError, match="Unsupported attribute"):
        read_job('locals {\n  a = local.b\n  b = local.a\n}\njob "j" {\n}\n', "job.hcl")


def test_dynamic_blocks_nest_and_take_maps() -> None:
    text = """job "j" {
  dynamic "group" {
    for_each = { web = 2, api = 1 }
    labels   = [group.key]
    content {
      count = group.value
      dynamic "task" {
        for_each = range(group.value)
        iterator = t
        labels   = ["${group.key}-${t.value}"]
        content {
          driver = "docker"
        }
      }
    }
  }
}
"""
    reading = read_job(text, "job.hcl")
    ((_, body),) = labelled(reading.body["job"])
    groups = {name: [task for task, _ in labelled(group["task"])] for name, group in labelled(body["group"])}
    assert groups == {"api": ["api-0"], "web": ["web-0", "web-1"]}  # a map's keys in lexical order


def test_dynamic_for_each_that_is_not_evaluated_is_listed() -> None:
    reading = read_job(
        'job "j" {\n  dynamic "group" {\n    for_each = uuidv4()\n    content {\n    }\n  }\n}\n', "job.hcl"
    )
    assert any('dynamic "group" is not expanded' in u for u in reading.unknown)


def test_heredocs_and_file(tmp_path: Path) -> None:
    (tmp_path / "script.sh").write_text("echo hi\n")
    text = (
        'job "j" {\n  a = <<EOT\nplain ${upper("x")} {{ env "NOMAD_TASK_DIR" }} ${NOMAD_TASK_DIR}\nEOT\n'
        '  b = <<-EOT\n    indented\n      more\n    EOT \n  c = file("script.sh")\n}\n'
    )
    attrs = job_attrs(text, base_dir=tmp_path)
    assert attrs["a"] == 'plain X {{ env "NOMAD_TASK_DIR" }} ${NOMAD_TASK_DIR}\n'
    assert attrs["b"] == "indented\n  more\n"
    assert attrs["c"] == "echo hi\n"


def test_unimplemented_function_is_unknown_and_an_unknown_name_is_an_error() -> None:
    attrs = job_attrs('job "j" {\n  a = uuidv4()\n  b = "x-${uuidv4()}"\n}\n')
    assert isinstance(attrs["a"], Unknown) and "uuidv4" in attrs["a"].why
    assert isinstance(attrs["b"], Unknown)
    with pytest.raises(HclError, match='There is no function named "tostring"'):
        read_job('job "j" {\n  a = tostring(1)\n}\n', "job.hcl")


def test_strip_markers_are_cannot_tell_not_a_syntax_error() -> None:
    with pytest.raises(HclError) as err:
        read_job('job "j" {\n  a = "${~ 1 ~}"\n}\n', "job.hcl")
    assert "cannot tell" in err.value.text("job.hcl")
    attrs = job_attrs('job "j" {\n  a = "x %{~ if true ~} y %{~ endif ~}"\n}\n')
    assert isinstance(attrs["a"], Unknown) and "strip markers" in attrs["a"].why


def test_nesting_beyond_what_check_job_evaluates_is_cannot_tell() -> None:
    with pytest.raises(HclError) as err:
        read_job('job "j" {\n  a = ' + "[" * 400 + "]" * 400 + "\n}\n", "job.hcl")
    assert "cannot tell" in err.value.text("job.hcl")
    deep = read_job('job "j" {\n  a = jsondecode("' + "[" * 5000 + "]" * 5000 + '")\n}\n', "job.hcl")
    assert any("jsondecode" in u for u in deep.unknown)
