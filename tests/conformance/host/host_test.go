package main

// Unit tests of the host's pure parts: spec conversion (§4.2), the HCL v1
// reshaping, --set overrides, msgpack encoding and Nomad's validation rules.
// Run by tests/conformance/test_host_units.py through `go test`.

import (
	"bytes"
	"io/ioutil"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"

	basepb "lingjunconf/pb/base"
	devicepb "lingjunconf/pb/device"
	hclspecpb "lingjunconf/pb/hclspec"
	structspb "lingjunconf/pb/structs"
)

func attrSpec(name, typ string) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Attr{Attr: &hclspecpb.Attr{Name: name, Type: typ}}}
}

func literal(v string) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Literal{Literal: &hclspecpb.Literal{Value: v}}}
}

func object(attrs map[string]*hclspecpb.Spec) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Object{Object: &hclspecpb.Object{Attributes: attrs}}}
}

func defaultSpec(primary, def *hclspecpb.Spec) *hclspecpb.Spec {
	return &hclspecpb.Spec{Block: &hclspecpb.Spec_Default{Default: &hclspecpb.Default{Primary: primary, Default: def}}}
}

func decode(t *testing.T, s *hclspecpb.Spec, cfg map[string]interface{}) (cty.Value, error) {
	t.Helper()
	spec, err := convertSpec(s, "")
	if err != nil {
		return cty.NilVal, err
	}
	dc, err := decodeConfig(spec, cfg)
	if err != nil {
		return cty.NilVal, err
	}
	return dc.Value, nil
}

func TestImpliedNamesAndDefaults(t *testing.T) {
	s := object(map[string]*hclspecpb.Spec{
		"period":  defaultSpec(attrSpec("period", "string"), literal(`"1m"`)),
		"ids":     defaultSpec(attrSpec("ids", "list(string)"), literal("[]")),
		"limit":   attrSpec("", "number"), // implied name from the Object key
		"anyattr": attrSpec("", "null"),   // null type -> any
	})
	v, err := decode(t, s, map[string]interface{}{"limit": 5, "anyattr": "x"})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.GetAttr("period").AsString(); got != "1m" {
		t.Errorf("period default: %q", got)
	}
	if v.GetAttr("ids").LengthInt() != 0 {
		t.Errorf("ids default not empty")
	}
	if !v.GetAttr("limit").RawEquals(cty.NumberIntVal(5)) {
		t.Errorf("limit: %#v", v.GetAttr("limit"))
	}
	if v.GetAttr("anyattr").AsString() != "x" {
		t.Errorf("anyattr: %#v", v.GetAttr("anyattr"))
	}
}

func TestAttrInsideDefaultNeedsItsOwnName(t *testing.T) {
	s := object(map[string]*hclspecpb.Spec{"x": defaultSpec(attrSpec("", "string"), literal(`"a"`))})
	if _, err := convertSpec(s, ""); err == nil || !strings.Contains(err.Error(), "Missing name") {
		t.Fatalf("want Missing name error, got %v", err)
	}
}

func TestTypeExpressions(t *testing.T) {
	good := map[string]cty.Type{
		"string": cty.String, "number": cty.Number, "bool": cty.Bool, "any": cty.DynamicPseudoType,
		"list(string)": cty.List(cty.String), "set(number)": cty.Set(cty.Number), "map(bool)": cty.Map(cty.Bool),
		"object({a = string})":  cty.Object(map[string]cty.Type{"a": cty.String}),
		"tuple([string, bool])": cty.Tuple([]cty.Type{cty.String, cty.Bool}),
	}
	for src, want := range good {
		got, err := parseTypeExpr(src)
		if err != nil || !got.Equals(want) {
			t.Errorf("%s: got %v, %v", src, got, err)
		}
	}
	for _, bad := range []string{"", "strin", "list(", "list(string, number)"} {
		if _, err := parseTypeExpr(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestBlockKinds(t *testing.T) {
	nested := object(map[string]*hclspecpb.Spec{"n": attrSpec("", "number")})
	s := object(map[string]*hclspecpb.Spec{
		"one":   {Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{Nested: nested}}},
		"many":  {Block: &hclspecpb.Spec_BlockList{BlockList: &hclspecpb.BlockList{Nested: nested}}},
		"uniq":  {Block: &hclspecpb.Spec_BlockSet{BlockSet: &hclspecpb.BlockSet{Nested: nested}}},
		"named": {Block: &hclspecpb.Spec_BlockMap{BlockMap: &hclspecpb.BlockMap{Labels: []string{"key"}, Nested: nested}}},
		"tags":  {Block: &hclspecpb.Spec_BlockAttrs{BlockAttrs: &hclspecpb.BlockAttrs{Type: "string"}}},
		"pair":  {Block: &hclspecpb.Spec_Array{Array: &hclspecpb.Array{Values: []*hclspecpb.Spec{literal("1"), literal(`"b"`)}}}},
	})
	// The generic map as HCL v1 produces it from native syntax.
	src := `
	  one { n = 1 }
	  many { n = 2 }
	  many { n = 3 }
	  named "a" { n = 4 }
	  tags { x = "y" }`
	cfg := parseConfigBody(t, src)
	v, err := decode(t, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !v.GetAttr("one").GetAttr("n").RawEquals(cty.NumberIntVal(1)) {
		t.Errorf("one: %#v", v.GetAttr("one"))
	}
	if v.GetAttr("many").LengthInt() != 2 || v.GetAttr("uniq").LengthInt() != 0 {
		t.Errorf("many/uniq: %#v %#v", v.GetAttr("many"), v.GetAttr("uniq"))
	}
	if !v.GetAttr("named").Index(cty.StringVal("a")).GetAttr("n").RawEquals(cty.NumberIntVal(4)) {
		t.Errorf("named: %#v", v.GetAttr("named"))
	}
	if v.GetAttr("tags").Index(cty.StringVal("x")).AsString() != "y" {
		t.Errorf("tags: %#v", v.GetAttr("tags"))
	}
	if v.GetAttr("pair").LengthInt() != 2 {
		t.Errorf("pair: %#v", v.GetAttr("pair"))
	}
	bad := object(map[string]*hclspecpb.Spec{"m": {Block: &hclspecpb.Spec_BlockMap{BlockMap: &hclspecpb.BlockMap{Nested: nested}}}})
	if _, err := convertSpec(bad, ""); err == nil {
		t.Errorf("block_map without labels: want error")
	}
	noNested := object(map[string]*hclspecpb.Spec{"b": {Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{}}}})
	if _, err := convertSpec(noNested, ""); err == nil {
		t.Errorf("block without nested: want error")
	}
}

func parseConfigBody(t *testing.T, body string) map[string]interface{} {
	t.Helper()
	f := t.TempDir() + "/agent.hcl"
	writeFile(t, f, `plugin "p" {
  config {
`+body+`
  }
}`)
	pb, err := loadPluginBlock(f, "p")
	if err != nil || !pb.Found {
		t.Fatalf("load: %v found=%v", err, pb != nil && pb.Found)
	}
	return pb.Config
}

func TestHCL1ShapeOfMapAttribute(t *testing.T) {
	// HCL v1 turns `labels = { a = "b" }` into a list holding one map, which
	// then fails conversion to map(string): the caveat of §4.5.
	cfg := parseConfigBody(t, `labels = { a = "b" }`)
	s := object(map[string]*hclspecpb.Spec{"labels": attrSpec("", "map(string)")})
	if _, err := decode(t, s, cfg); err == nil {
		t.Fatalf("want a conversion error for an HCL v1 map attribute")
	}
	cfg = parseConfigBody(t, `list = [{ a = "b" }]`)
	if _, ok := cfg["list"].([]interface{})[0].(map[string]interface{}); !ok {
		t.Fatalf("object inside a list must stay a map: %#v", cfg["list"])
	}
}

func TestNoSchemaWithConfigIsAnError(t *testing.T) {
	if _, err := decodeConfig(nil, map[string]interface{}{"a": 1}); err == nil {
		t.Fatal("want error")
	}
	dc, err := decodeConfig(nil, map[string]interface{}{})
	if err != nil || len(dc.Msgpack) != 0 {
		t.Fatalf("no schema, no config: %v %d bytes", err, len(dc.Msgpack))
	}
}

func TestOverrides(t *testing.T) {
	cfg := parseConfigBody(t, `xdm {
 socket = "/a"
}`)
	for _, kv := range []string{`xdm.socket="/b"`, `top=5`, `new.key=true`} {
		if err := applyOverride(cfg, kv); err != nil {
			t.Fatal(err)
		}
	}
	if cfg["xdm"].([]interface{})[0].(map[string]interface{})["socket"] != "/b" {
		t.Errorf("xdm.socket: %#v", cfg["xdm"])
	}
	if cfg["new"].([]interface{})[0].(map[string]interface{})["key"] != true {
		t.Errorf("new.key: %#v", cfg["new"])
	}
	for _, bad := range []string{"novalue", "k=notjson", "=1"} {
		if err := applyOverride(cfg, bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestMsgpackNumbers(t *testing.T) {
	s := object(map[string]*hclspecpb.Spec{
		"i": attrSpec("", "number"), "h": attrSpec("", "number"), "d": attrSpec("", "number"), "u": attrSpec("", "string"),
	})
	spec, err := convertSpec(s, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseConfigBody(t, "i = 7\n h = 0.5\n d = 0.1")
	dc, err := decodeConfig(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Object keys sorted; integer -> fixint, exact float -> float64 (0xcb),
	// inexact decimal -> its text as a string, unset -> nil.
	want := []byte{0x84,
		0xa1, 'd', 0xa3, '0', '.', '1',
		0xa1, 'h', 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0,
		0xa1, 'i', 0x07,
		0xa1, 'u', 0xc0}
	if !bytes.Equal(dc.Msgpack, want) {
		t.Errorf("msgpack % x\nwant    % x", dc.Msgpack, want)
	}
}

func TestUnitsAndAttributes(t *testing.T) {
	for _, u := range []string{"MiB", "GiB", "kB", "MB/s", "KiB/s", "MHz", "GHz", "W", "mW", "kW"} {
		if validateAttribute(&structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: 1}, Unit: u}) != nil {
			t.Errorf("unit %s should be valid", u)
		}
	}
	for _, u := range []string{"%", "C", "B", "Hz", "mib", "GB/S"} {
		f := validateAttribute(&structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: 1}, Unit: u})
		if f == nil || f.Rule != "fingerprint.attribute_unknown_unit" {
			t.Errorf("unit %q: %#v", u, f)
		}
	}
	f := validateAttribute(&structspb.Attribute{Value: &structspb.Attribute_StringVal{StringVal: "x"}, Unit: "MiB"})
	if f == nil || f.Rule != "fingerprint.attribute_unit_non_numeric" {
		t.Errorf("unit on string: %#v", f)
	}
	if f := validateAttribute(&structspb.Attribute{}); f == nil || f.Rule != "fingerprint.attribute_no_value" {
		t.Errorf("empty: %#v", f)
	}
	if validateAttribute(&structspb.Attribute{Value: &structspb.Attribute_IntVal{IntVal: 0}}) != nil {
		t.Errorf("int 0 with oneof set is a value")
	}
}

func TestFingerprintRules(t *testing.T) {
	g := func(v, ty, n string, ids ...string) *devicepb.DeviceGroup {
		dg := &devicepb.DeviceGroup{Vendor: v, DeviceType: ty, DeviceName: n}
		for _, id := range ids {
			dg.Devices = append(dg.Devices, &devicepb.DetectedDevice{ID: id})
		}
		return dg
	}
	viol, warn := validateFingerprint(&devicepb.FingerprintResponse{DeviceGroup: []*devicepb.DeviceGroup{
		g("", "t", "n", "a"), g("v", "", "n"), g("v", "t", ""), g("v", "t", "n", "a", "a"), g("v", "t", "n", ""),
	}})
	want := []string{"fingerprint.vendor_empty", "fingerprint.device_type_empty", "fingerprint.device_name_empty",
		"fingerprint.duplicate_group", "fingerprint.device_id_empty"}
	if len(viol) != len(want) {
		t.Fatalf("violations: %#v", viol)
	}
	for i, w := range want {
		if viol[i].Rule != w {
			t.Errorf("violation %d: %s, want %s", i, viol[i].Rule, w)
		}
	}
	if len(warn) != 1 || warn[0].Rule != "fingerprint.duplicate_device_id" {
		t.Errorf("warnings: %#v", warn)
	}
	if v, w := validateFingerprint(&devicepb.FingerprintResponse{}); len(v)+len(w) != 0 {
		t.Errorf("empty fingerprint is valid")
	}
}

func TestPluginInfoRules(t *testing.T) {
	ok := &basepb.PluginInfoResponse{Type: basepb.PluginType_DEVICE, PluginApiVersions: []string{"0.1.0"}, PluginVersion: "1.2.3-beta", Name: "x"}
	if f, api := validatePluginInfo(ok); len(f) != 0 || api != "0.1.0" {
		t.Errorf("ok info: %#v %q (Nomad keeps the plugin's own spelling)", f, api)
	}
	bad := &basepb.PluginInfoResponse{Type: basepb.PluginType_DRIVER, PluginApiVersions: []string{"garbage"}, PluginVersion: ""}
	f, _ := validatePluginInfo(bad)
	rules := map[string]bool{}
	for _, x := range f {
		rules[x.Rule] = true
	}
	for _, r := range []string{"plugin_info.type", "plugin_info.api_version_invalid", "plugin_info.api_version_no_overlap", "plugin_info.plugin_version_invalid", "plugin_info.name_empty"} {
		if !rules[r] {
			t.Errorf("missing %s in %#v", r, f)
		}
	}
	if f, _ := validatePluginInfo(&basepb.PluginInfoResponse{Type: basepb.PluginType_DEVICE, PluginVersion: "1.0.0", Name: "x"}); len(f) != 1 || f[0].Rule != "plugin_info.api_versions_empty" {
		t.Errorf("empty versions: %#v", f)
	}
}

func TestReservationRules(t *testing.T) {
	if f := validateReservation(&devicepb.ReserveResponse{}); len(f) != 1 || f[0].Rule != "reserve.container_res_missing" {
		t.Errorf("missing container_res: %#v", f)
	}
	resp := &devicepb.ReserveResponse{ContainerRes: &devicepb.ContainerReservation{
		Devices: []*devicepb.DeviceSpec{{TaskPath: "/dev/a", HostPath: "dev/a", Permissions: "rwx"}},
		Mounts:  []*devicepb.Mount{{TaskPath: "rel", HostPath: "/abs"}},
	}}
	f := validateReservation(resp)
	if len(f) != 3 {
		t.Errorf("want 3 findings, got %#v", f)
	}
	if f := validateReservation(&devicepb.ReserveResponse{ContainerRes: &devicepb.ContainerReservation{}}); len(f) != 0 {
		t.Errorf("empty reservation is valid: %#v", f)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := ioutil.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The automatic Reserve waits for a fingerprint that holds the devices: an
// empty fingerprint (the plugin's first answer, before its backend answered)
// or one with too few healthy devices never fires it.
func TestAutoPickWaitsForAFingerprintThatHoldsTheDevices(t *testing.T) {
	r := &runner{o: &Options{ReserveCount: 2}}
	if _, ok := r.autoPick(nil); ok {
		t.Fatal("an empty fingerprint fired the auto reserve")
	}
	one := []fpGroup{{key: "v/t/a", ids: map[string]bool{"x": true, "y": true}, healthy: []string{"y"}}}
	if _, ok := r.autoPick(one); ok {
		t.Fatal("a group with 1 healthy device fired a reserve of 2")
	}
	two := []fpGroup{{key: "v/t/a", ids: map[string]bool{"x": true, "y": true}, healthy: []string{"y", "x"}}}
	if ids, ok := r.autoPick(two); !ok || strings.Join(ids, ",") != "y,x" {
		t.Fatalf("want y,x (message order), got %v %v", ids, ok)
	}
	r.o.ReserveGroup = "v/t/b"
	if _, ok := r.autoPick(two); ok {
		t.Fatal("--reserve-group v/t/b fired on group v/t/a")
	}
	r.o = &Options{ReserveIDs: "x,z"}
	if _, ok := r.autoPick(two); ok {
		t.Fatal("--reserve-ids x,z fired although z is in no group")
	}
	r.o.ReserveIDs = "x"
	if ids, ok := r.autoPick(two); !ok || len(ids) != 1 || ids[0] != "x" {
		t.Fatalf("want [x], got %v %v", ids, ok)
	}
	if got := r.awaited(); !strings.Contains(got, "x") {
		t.Fatalf("awaited() does not name the IDs: %q", got)
	}
}
