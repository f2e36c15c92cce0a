package main

// Conversion of the plugin's ConfigSchema (hclspec proto) into an hcldec
// spec, by the rules of Nomad's helper/pluginutils/hclspecutils
// (`hclspecutils/dec.go`), written from that file's behaviour.

import (
	"fmt"

	hcl "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	hclspecpb "lingjunconf/pb/hclspec"
)

// nomadEvalContext mirrors the agent's config eval context: no variables and
// a small set of pure functions.
func nomadEvalContext() *hcl.EvalContext {
	return &hcl.EvalContext{Functions: map[string]function.Function{
		"abs":        stdlib.AbsoluteFunc,
		"coalesce":   stdlib.CoalesceFunc,
		"concat":     stdlib.ConcatFunc,
		"hasindex":   stdlib.HasIndexFunc,
		"int":        stdlib.IntFunc,
		"jsondecode": stdlib.JSONDecodeFunc,
		"jsonencode": stdlib.JSONEncodeFunc,
		"length":     stdlib.LengthFunc,
		"lower":      stdlib.LowerFunc,
		"max":        stdlib.MaxFunc,
		"min":        stdlib.MinFunc,
		"reverse":    stdlib.ReverseFunc,
		"strlen":     stdlib.StrlenFunc,
		"substr":     stdlib.SubstrFunc,
		"upper":      stdlib.UpperFunc,
	}}
}

// convertSpec converts a proto spec; impliedName is the Object key the spec
// sits under ("" everywhere else).
func convertSpec(s *hclspecpb.Spec, impliedName string) (hcldec.Spec, error) {
	if s == nil {
		return nil, fmt.Errorf("nil spec")
	}
	switch b := s.Block.(type) {
	case *hclspecpb.Spec_Object:
		obj := hcldec.ObjectSpec{}
		for k, v := range b.Object.GetAttributes() {
			c, err := convertSpec(v, k)
			if err != nil {
				return nil, fmt.Errorf("object attribute %q: %v", k, err)
			}
			obj[k] = c
		}
		return obj, nil
	case *hclspecpb.Spec_Array:
		tup := hcldec.TupleSpec{}
		for i, v := range b.Array.GetValues() {
			c, err := convertSpec(v, "")
			if err != nil {
				return nil, fmt.Errorf("array element %d: %v", i, err)
			}
			tup = append(tup, c)
		}
		return tup, nil
	case *hclspecpb.Spec_Attr:
		name := pick(b.Attr.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in attribute spec")
		}
		ty, err := parseTypeExpr(b.Attr.GetType())
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %v", name, err)
		}
		return &hcldec.AttrSpec{Name: name, Type: ty, Required: b.Attr.GetRequired()}, nil
	case *hclspecpb.Spec_BlockValue:
		name := pick(b.BlockValue.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in block spec")
		}
		nested, err := convertNested(b.BlockValue.GetNested(), name)
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockSpec{TypeName: name, Nested: nested, Required: b.BlockValue.GetRequired()}, nil
	case *hclspecpb.Spec_BlockAttrs:
		name := pick(b.BlockAttrs.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in block_attrs spec")
		}
		ty, err := parseTypeExpr(b.BlockAttrs.GetType())
		if err != nil {
			return nil, fmt.Errorf("block_attrs %q: %v", name, err)
		}
		return &hcldec.BlockAttrsSpec{TypeName: name, ElementType: ty, Required: b.BlockAttrs.GetRequired()}, nil
	case *hclspecpb.Spec_BlockList:
		name := pick(b.BlockList.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in block_list spec")
		}
		nested, err := convertNested(b.BlockList.GetNested(), name)
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockListSpec{TypeName: name, Nested: nested,
			MinItems: int(b.BlockList.GetMinItems()), MaxItems: int(b.BlockList.GetMaxItems())}, nil
	case *hclspecpb.Spec_BlockSet:
		name := pick(b.BlockSet.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in block_set spec")
		}
		nested, err := convertNested(b.BlockSet.GetNested(), name)
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockSetSpec{TypeName: name, Nested: nested,
			MinItems: int(b.BlockSet.GetMinItems()), MaxItems: int(b.BlockSet.GetMaxItems())}, nil
	case *hclspecpb.Spec_BlockMap:
		name := pick(b.BlockMap.GetName(), impliedName)
		if name == "" {
			return nil, fmt.Errorf("Missing name in block_map spec")
		}
		if len(b.BlockMap.GetLabels()) == 0 {
			return nil, fmt.Errorf("block_map %q: at least one label is required", name)
		}
		nested, err := convertNested(b.BlockMap.GetNested(), name)
		if err != nil {
			return nil, err
		}
		return &hcldec.BlockMapSpec{TypeName: name, LabelNames: b.BlockMap.GetLabels(), Nested: nested}, nil
	case *hclspecpb.Spec_Default:
		// Both sides are converted without an implied name (Nomad's rule):
		// an Attr inside a Default must name itself.
		primary, err := convertSpec(b.Default.GetPrimary(), "")
		if err != nil {
			return nil, fmt.Errorf("default primary: %v", err)
		}
		def, err := convertSpec(b.Default.GetDefault(), "")
		if err != nil {
			return nil, fmt.Errorf("default value: %v", err)
		}
		return &hcldec.DefaultSpec{Primary: primary, Default: def}, nil
	case *hclspecpb.Spec_Literal:
		val, err := evalLiteral(b.Literal.GetValue())
		if err != nil {
			return nil, err
		}
		return &hcldec.LiteralSpec{Value: val}, nil
	default:
		return nil, fmt.Errorf("spec has no block set (unknown spec type %T)", s.Block)
	}
}

func convertNested(s *hclspecpb.Spec, owner string) (hcldec.Spec, error) {
	if s == nil {
		return nil, fmt.Errorf("block %q: missing nested spec", owner)
	}
	n, err := convertSpec(s, "")
	if err != nil {
		return nil, fmt.Errorf("block %q: %v", owner, err)
	}
	return n, nil
}

func pick(name, implied string) string {
	if name != "" {
		return name
	}
	return implied
}

// parseTypeExpr parses an HCL type expression such as `list(string)`.
// An empty string is rejected, as in Nomad (the expression is parsed
// unconditionally). `null` evaluates to "any" as in Nomad's evaluator.
func parseTypeExpr(src string) (cty.Type, error) {
	expr, diags := hclsyntax.ParseExpression([]byte(src), "proto", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("failed to parse type %q: %s", src, diags.Error())
	}
	if hcl.ExprAsKeyword(expr) == "null" {
		return cty.DynamicPseudoType, nil
	}
	ty, diags := typeexpr.TypeConstraint(expr)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("invalid type %q: %s", src, diags.Error())
	}
	return ty, nil
}

func evalLiteral(src string) (cty.Value, error) {
	expr, diags := hclsyntax.ParseExpression([]byte(src), "proto", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("failed to parse literal %q: %s", src, diags.Error())
	}
	val, diags := expr.Value(nomadEvalContext())
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("failed to evaluate literal %q: %s", src, diags.Error())
	}
	return val, nil
}
