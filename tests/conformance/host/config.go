package main

// The agent-config side of SetConfig (Nomad's `command/agent/config_parse.go` and `plugins/base/plugin.go`): read the
// `plugin "<name>" { args = [...] config { ... } }` block, turn the config
// body into the generic map Nomad's HCL v1 parser would have produced,
// apply --set overrides, JSON-encode it, parse that as an HCL v2 JSON body,
// hcldec.Decode it with the converted spec and msgpack-encode the value with
// its own type.
//
// Difference from Nomad: Debian has no HCL v1, so plugin.hcl is parsed with
// HCL v2 native syntax and the result is reshaped by HCL v1's rules for
// decoding into interface{} (an object directly under a map key becomes a
// one-element list of maps, an object inside a list stays a map; nested and
// repeated blocks become lists of maps; labelled blocks nest one level per
// label). Expressions must be literals (no variables), as in HCL v1.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"strings"

	hcl "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"
)

// pluginBlock is what the agent keeps of one plugin block.
type pluginBlock struct {
	Found  bool
	Args   []string
	Config map[string]interface{}
}

// loadPluginBlock reads the plugin block named `name` from an agent config
// file. A missing file path yields an empty config (Nomad: no config block
// means an empty map; defaults still apply).
func loadPluginBlock(path, name string) (*pluginBlock, error) {
	pb := &pluginBlock{Config: map[string]interface{}{}}
	if path == "" {
		return pb, nil
	}
	src, err := ioutil.ReadFile(path)
	if err != nil {
		return nil, err
	}
	file, diags := hclsyntax.ParseConfig(src, path, hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return nil, fmt.Errorf("parse %s: %s", path, diags.Error())
	}
	body := file.Body.(*hclsyntax.Body)
	for _, blk := range body.Blocks {
		if blk.Type != "plugin" || len(blk.Labels) != 1 || blk.Labels[0] != name {
			continue
		}
		if pb.Found {
			return nil, fmt.Errorf("%s: more than one plugin %q block", path, name)
		}
		pb.Found = true
		if attr, ok := blk.Body.Attributes["args"]; ok {
			v, d := attr.Expr.Value(nil)
			if d.HasErrors() {
				return nil, fmt.Errorf("plugin %q args: %s", name, d.Error())
			}
			if !v.CanIterateElements() {
				return nil, fmt.Errorf("plugin %q args: not a list", name)
			}
			for it := v.ElementIterator(); it.Next(); {
				_, ev := it.Element()
				if ev.Type() != cty.String {
					return nil, fmt.Errorf("plugin %q args: every element must be a string", name)
				}
				pb.Args = append(pb.Args, ev.AsString())
			}
		}
		for _, inner := range blk.Body.Blocks {
			if inner.Type != "config" {
				continue
			}
			m, err := hcl1Map(inner.Body)
			if err != nil {
				return nil, fmt.Errorf("plugin %q config: %v", name, err)
			}
			for k, v := range m {
				pb.Config[k] = v
			}
		}
	}
	return pb, nil
}

// hcl1Map converts a native-syntax body to the generic value HCL v1 gives.
func hcl1Map(body *hclsyntax.Body) (map[string]interface{}, error) {
	out := map[string]interface{}{}
	for name, attr := range body.Attributes {
		v, d := attr.Expr.Value(nil)
		if d.HasErrors() {
			return nil, fmt.Errorf("%s: %s", name, d.Error())
		}
		g, err := ctyToGeneric(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		out[name] = hcl1Shape(g, false)
	}
	for _, blk := range body.Blocks {
		nested, err := hcl1Map(blk.Body)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", blk.Type, err)
		}
		var val interface{} = nested
		for i := len(blk.Labels) - 1; i >= 0; i-- {
			val = map[string]interface{}{blk.Labels[i]: []interface{}{val}}
		}
		prev, _ := out[blk.Type].([]interface{})
		out[blk.Type] = append(prev, val)
	}
	return out, nil
}

// hcl1Shape applies HCL v1's interface{} rule: objects directly under a map
// key become a list holding one map; objects inside a list stay maps.
func hcl1Shape(v interface{}, inList bool) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := map[string]interface{}{}
		for k, e := range t {
			m[k] = hcl1Shape(e, false)
		}
		if inList {
			return m
		}
		return []interface{}{m}
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, e := range t {
			l[i] = hcl1Shape(e, true)
		}
		return l
	default:
		return v
	}
}

func ctyToGeneric(v cty.Value) (interface{}, error) {
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		return nil, err
	}
	return decodeJSONGeneric(b)
}

func decodeJSONGeneric(b []byte) (interface{}, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var g interface{}
	if err := dec.Decode(&g); err != nil {
		return nil, err
	}
	return g, nil
}

// applyOverride sets key (dotted path; a one-element list of maps, HCL v1's
// block shape, is stepped through) to a JSON value.
func applyOverride(cfg map[string]interface{}, kv string) error {
	eq := strings.IndexByte(kv, '=')
	if eq <= 0 {
		return fmt.Errorf("--set %q: want key=<json>", kv)
	}
	key, raw := kv[:eq], kv[eq+1:]
	val, err := decodeJSONGeneric([]byte(raw))
	if err != nil {
		return fmt.Errorf("--set %s: value is not JSON: %v", key, err)
	}
	parts := strings.Split(key, ".")
	cur := cfg
	for _, p := range parts[:len(parts)-1] {
		next, ok := cur[p]
		if !ok {
			m := map[string]interface{}{}
			cur[p] = []interface{}{m}
			cur = m
			continue
		}
		switch t := next.(type) {
		case map[string]interface{}:
			cur = t
		case []interface{}:
			if len(t) != 1 {
				return fmt.Errorf("--set %s: %q holds %d blocks; cannot choose", key, p, len(t))
			}
			m, ok := t[0].(map[string]interface{})
			if !ok {
				return fmt.Errorf("--set %s: %q is not a block", key, p)
			}
			cur = m
		default:
			return fmt.Errorf("--set %s: %q is not a block", key, p)
		}
	}
	cur[parts[len(parts)-1]] = val
	return nil
}

// decodedConfig is the outcome of decoding the config against the schema.
type decodedConfig struct {
	JSON    json.RawMessage // the generic map as sent to the HCL v2 JSON parser
	Value   cty.Value
	Msgpack []byte
}

// decodeConfig runs Nomad's pipeline. spec == nil means the plugin returned
// no schema: then no config may be given and msgpack_config is empty.
func decodeConfig(spec hcldec.Spec, cfg map[string]interface{}) (*decodedConfig, error) {
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	out := &decodedConfig{JSON: js}
	if spec == nil {
		if len(cfg) > 0 {
			return nil, fmt.Errorf("configuration not allowed but config passed")
		}
		return out, nil
	}
	file, diags := hcljson.Parse(js, "plugin-config.json")
	if diags.HasErrors() {
		return nil, fmt.Errorf("hcl json parse: %s", diags.Error())
	}
	val, diags := hcldec.Decode(file.Body, spec, nomadEvalContext())
	if diags.HasErrors() {
		return nil, fmt.Errorf("decode: %s", diags.Error())
	}
	out.Value = val
	mp, err := ctymsgpack.Marshal(val, val.Type())
	if err != nil {
		return nil, fmt.Errorf("msgpack: %v", err)
	}
	out.Msgpack = mp
	return out, nil
}

// valueJSON renders a cty value for events (null when unset).
func valueJSON(v cty.Value) json.RawMessage {
	if v == cty.NilVal {
		return json.RawMessage("null")
	}
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		b, _ = json.Marshal(err.Error())
	}
	return b
}
