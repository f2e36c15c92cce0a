package main

// HCL2 operations: HashiCorp's hclsyntax parser and expression evaluator with
// cty's stdlib functions under the names jobspec2/functions.go gives them, so
// that nomad_plugin/jobspec/hcl2_eval.py is compared with the Go it reproduces.
//
//	hcl_syntax   {"s": file text}: hclsyntax.ParseConfig's diagnostics
//	hcl_eval     {"s": expression, "vars": {"var": ..., "local": ...}}: ParseExpression + Value;
//	             names other than the vars' roots fail, as they do in hcl without Nomad's fork;
//	             a number also comes as "text", its exact decimal

import (
	"encoding/json"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

var jobspecFunctions = map[string]function.Function{
	"abs": stdlib.AbsoluteFunc, "ceil": stdlib.CeilFunc, "chomp": stdlib.ChompFunc,
	"chunklist": stdlib.ChunklistFunc, "coalesce": stdlib.CoalesceFunc, "coalescelist": stdlib.CoalesceListFunc,
	"compact": stdlib.CompactFunc, "concat": stdlib.ConcatFunc, "contains": stdlib.ContainsFunc,
	"distinct": stdlib.DistinctFunc, "element": stdlib.ElementFunc, "flatten": stdlib.FlattenFunc,
	"floor": stdlib.FloorFunc, "format": stdlib.FormatFunc, "formatlist": stdlib.FormatListFunc,
	"indent": stdlib.IndentFunc, "index": stdlib.IndexFunc, "join": stdlib.JoinFunc,
	"jsondecode": stdlib.JSONDecodeFunc, "jsonencode": stdlib.JSONEncodeFunc, "keys": stdlib.KeysFunc,
	"length": stdlib.LengthFunc, "log": stdlib.LogFunc, "lookup": stdlib.LookupFunc, "lower": stdlib.LowerFunc,
	"max": stdlib.MaxFunc, "merge": stdlib.MergeFunc, "min": stdlib.MinFunc, "parseint": stdlib.ParseIntFunc,
	"pow": stdlib.PowFunc, "range": stdlib.RangeFunc, "reverse": stdlib.ReverseFunc,
	"replace": stdlib.ReplaceFunc, "regex_replace": stdlib.RegexReplaceFunc, "signum": stdlib.SignumFunc,
	"slice": stdlib.SliceFunc, "sort": stdlib.SortFunc, "split": stdlib.SplitFunc, "strlen": stdlib.StrlenFunc,
	"strrev": stdlib.ReverseFunc, "substr": stdlib.SubstrFunc, "title": stdlib.TitleFunc, "trim": stdlib.TrimFunc,
	"trimprefix": stdlib.TrimPrefixFunc, "trimspace": stdlib.TrimSpaceFunc, "trimsuffix": stdlib.TrimSuffixFunc,
	"upper": stdlib.UpperFunc, "values": stdlib.ValuesFunc, "zipmap": stdlib.ZipmapFunc,
}

func diagTexts(diags hcl.Diagnostics) []string {
	out := []string{}
	for _, d := range diags {
		out = append(out, d.Error())
	}
	return out
}

func hclOp(req request) answer {
	switch req.Op {
	case "hcl_syntax":
		_, diags := hclsyntax.ParseConfig([]byte(req.S), "job.hcl", hcl.Pos{Line: 1, Column: 1})
		return answer{"diags": diagTexts(diags)}
	case "hcl_eval":
		ctx := &hcl.EvalContext{Functions: jobspecFunctions, Variables: map[string]cty.Value{}}
		if len(req.Vars) > 0 {
			ty, err := ctyjson.ImpliedType(req.Vars)
			if err != nil {
				return answer{"error": err.Error()}
			}
			vars, err := ctyjson.Unmarshal(req.Vars, ty)
			if err != nil {
				return answer{"error": err.Error()}
			}
			ctx.Variables = vars.AsValueMap()
		}
		expr, diags := hclsyntax.ParseExpression([]byte(req.S), "expr.hcl", hcl.Pos{Line: 1, Column: 1})
		if diags.HasErrors() {
			return answer{"ok": false, "diags": diagTexts(diags)}
		}
		val, diags := expr.Value(ctx)
		if diags.HasErrors() {
			return answer{"ok": false, "diags": diagTexts(diags)}
		}
		raw, err := ctyjson.Marshal(val, cty.DynamicPseudoType)
		if err != nil {
			return answer{"error": err.Error()}
		}
		var typed struct {
			Value json.RawMessage `json:"value"`
			Type  json.RawMessage `json:"type"`
		}
		if err := json.Unmarshal(raw, &typed); err != nil {
			return answer{"error": err.Error()}
		}
		ans := answer{"ok": true, "value": typed.Value, "type": typed.Type}
		if val.Type() == cty.Number && val.IsKnown() && !val.IsNull() {
			ans["text"] = val.AsBigFloat().Text('f', -1) // the exact number, as cty converts it to a string
		}
		return ans
	}
	return answer{"error": "unknown op " + req.Op}
}
