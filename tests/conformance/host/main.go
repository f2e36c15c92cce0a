// conformance-host loads a Nomad device plugin executable exactly the way
// the Nomad agent does (go-plugin client, Nomad's handshake and plugin map),
// replays Nomad's three launches and checks every answer against Nomad's
// rules. Output: one JSON event per line on stdout; the plugin's log lines
// go to stderr through an hclog logger at trace level. Exit status: 0 when
// no violation was seen, 1 when at least one was, 2 on a usage error.
//
// See tests/conformance/README.md for the flags and the event format.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/golang/protobuf/jsonpb"
	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2/hcldec"
	"google.golang.org/grpc/status"

	basepb "lingjunconf/pb/base"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// Options are the command-line flags.
type Options struct {
	Phase           string
	Plugin          string
	ExtraArgs       stringList
	PluginArgs      []string
	Config          string
	PluginName      string
	Sets            stringList
	ExpectSetConfig string
	Duration        float64
	StatsInterval   float64
	StatsDetail     bool
	ReserveGroup    string
	ReserveCount    int
	ReserveIDs      string
	ReserveAfterFP  int
	ReserveTimeout  float64
	ExpectReserve   string
	RPCTimeout      float64
	FirstFPTimeout  float64
	Stdin           bool
	LogSampleMax    int
	AgentSyntax     string
}

func parseFlags(args []string) (*Options, error) {
	o := &Options{}
	fs := flag.NewFlagSet("conformance-host", flag.ContinueOnError)
	fs.StringVar(&o.Phase, "phase", "all", "all|info|validate|run: which of Nomad's launches to replay (validate and run include info)")
	fs.StringVar(&o.Plugin, "plugin", "", "plugin executable (required)")
	fs.Var(&o.ExtraArgs, "plugin-arg", "extra argument for the plugin, after the plugin block's args (repeatable)")
	fs.StringVar(&o.Config, "config", "", "agent config file holding the plugin block (plugin.hcl); empty: no config block")
	fs.StringVar(&o.PluginName, "plugin-name", "nomad-device-lingjun", "label of the plugin block to read")
	fs.Var(&o.Sets, "set", "key=<json>: override a config key before decoding (dotted keys step into blocks; repeatable)")
	fs.StringVar(&o.ExpectSetConfig, "expect-set-config", "ok", "ok|error: whether the config must be accepted or rejected")
	fs.Float64Var(&o.Duration, "duration", 3, "run phase: seconds to keep the plugin running; <= 0 runs until {\"op\":\"stop\"} or stdin EOF (needs --stdin)")
	fs.Float64Var(&o.StatsInterval, "stats-interval", 1, "StatsRequest.collection_interval in seconds")
	fs.BoolVar(&o.StatsDetail, "stats-detail", false, "include every flattened stat in stats events")
	fs.StringVar(&o.ReserveGroup, "reserve-group", "", "vendor/type/name of the group to reserve from (default: first group)")
	fs.IntVar(&o.ReserveCount, "reserve-count", 0, "reserve this many healthy devices of one group, at the first fingerprint that holds them")
	fs.StringVar(&o.ReserveIDs, "reserve-ids", "", "comma-separated device IDs to reserve, at the first fingerprint in which one group holds them all")
	fs.IntVar(&o.ReserveAfterFP, "reserve-after-fp", 1, "earliest fingerprint message considered for the automatic Reserve (a lower bound; the reserve still waits for a fingerprint that holds the devices)")
	fs.Float64Var(&o.ReserveTimeout, "reserve-timeout", 30, "seconds after SetConfig to wait for a fingerprint that holds the devices to reserve; the run outlasts --duration until then")
	fs.StringVar(&o.ExpectReserve, "expect-reserve", "ok", "ok|error|any: expected outcome of the automatic reservation")
	fs.Float64Var(&o.RPCTimeout, "rpc-timeout", 30, "seconds before a unary RPC counts as hung")
	fs.Float64Var(&o.FirstFPTimeout, "first-fp-timeout", 50, "seconds to wait for the first fingerprint (Nomad batches for 50 s)")
	fs.BoolVar(&o.Stdin, "stdin", false, "run phase: read JSON-line commands from stdin")
	fs.IntVar(&o.LogSampleMax, "log-samples", 5, "at most this many warnings about malformed plugin log lines")
	fs.StringVar(&o.AgentSyntax, "agent-syntax", "hcl2", "hcl1|hcl2: read --config with HCL v1 as the Nomad agent does (agent_hcl1.go), or with HCL v2 native syntax")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.Plugin == "" {
		return nil, fmt.Errorf("--plugin is required")
	}
	switch o.Phase {
	case "all", "info", "validate", "run":
	default:
		return nil, fmt.Errorf("--phase %q: want all, info, validate or run", o.Phase)
	}
	if o.ExpectSetConfig != "ok" && o.ExpectSetConfig != "error" {
		return nil, fmt.Errorf("--expect-set-config %q: want ok or error", o.ExpectSetConfig)
	}
	if o.AgentSyntax != "hcl1" && o.AgentSyntax != "hcl2" {
		return nil, fmt.Errorf("--agent-syntax %q: want hcl1 or hcl2", o.AgentSyntax)
	}
	switch o.ExpectReserve {
	case "ok", "error", "any":
	default:
		return nil, fmt.Errorf("--expect-reserve %q: want ok, error or any", o.ExpectReserve)
	}
	if o.ReserveAfterFP < 1 {
		return nil, fmt.Errorf("--reserve-after-fp must be >= 1")
	}
	if o.ReserveTimeout <= 0 {
		return nil, fmt.Errorf("--reserve-timeout must be > 0")
	}
	return o, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agent-file" {
		os.Exit(dumpAgentFiles(os.Args[2:], os.Stdout))
	}
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance-host:", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func grpcError(err error) map[string]interface{} {
	st, _ := status.FromError(err)
	return map[string]interface{}{"error": err.Error(), "code": st.Code().String(), "message": st.Message()}
}

func run(o *Options) int {
	em := newEmitter()
	logger := hclog.New(&hclog.LoggerOptions{Name: "conformance-host", Level: hclog.Trace, Output: os.Stderr})
	fail := func(msg string) int {
		em.Emit("error", map[string]interface{}{"error": msg})
		em.Summary(nil)
		return 2
	}

	load := loadPluginBlock
	if o.AgentSyntax == "hcl1" {
		load = loadPluginBlockHCL1
	}
	pb, err := load(o.Config, o.PluginName)
	if err != nil {
		return fail(err.Error())
	}
	if o.Config != "" && !pb.Found {
		em.Violation("config.plugin_block_missing",
			fmt.Sprintf("%s has no plugin %q block (Nomad >= 1.10 does not run unreferenced plugins)", o.Config, o.PluginName), nil)
	}
	for _, kv := range o.Sets {
		if err := applyOverride(pb.Config, kv); err != nil {
			return fail(err.Error())
		}
	}
	o.PluginArgs = append(append([]string{}, pb.Args...), o.ExtraArgs...)
	em.Emit("config_file", map[string]interface{}{
		"path": o.Config, "plugin_name": o.PluginName, "found": pb.Found,
		"args": o.PluginArgs, "config": pb.Config,
	})

	logStats := map[string]interface{}{}
	finish := func() int {
		em.SetLaunch(0)
		em.Summary(map[string]interface{}{"logs": logStats, "phase": o.Phase})
		if em.Violations() > 0 {
			return 1
		}
		return 0
	}

	// Launch 1: PluginInfo + ConfigSchema, then kill.
	spec, apiVersion, ok := launchInfo(o, em, logger, logStats)
	if !ok || o.Phase == "info" {
		return finish()
	}

	// Config decoding happens in the agent between launches 1 and 2.
	var hspec hcldec.Spec
	if spec != nil {
		hspec, err = convertSpec(spec.Spec, "")
		if err != nil {
			em.Violation("config_schema.convert", fmt.Sprintf("schema does not convert to an hcldec spec: %v", err), nil)
			return finish()
		}
	}
	dc, err := decodeConfig(hspec, pb.Config)
	fields := map[string]interface{}{"ok": err == nil}
	if err != nil {
		fields["error"] = err.Error()
	} else {
		fields["value"] = valueJSON(dc.Value)
		fields["msgpack_b64"] = base64.StdEncoding.EncodeToString(dc.Msgpack)
		fields["hcl_json"] = dc.JSON
	}
	em.Emit("config_decoded", fields)
	if err != nil {
		if o.ExpectSetConfig == "ok" {
			em.Violation("config.decode", err.Error(), nil)
		}
		return finish()
	}

	if o.Phase == "validate" || o.Phase == "all" {
		if !launchValidate(o, em, logger, dc.Msgpack, apiVersion, logStats) {
			return finish()
		}
	}
	if o.Phase == "run" || o.Phase == "all" {
		launchRun(o, em, logger, dc.Msgpack, apiVersion, logStats)
	}
	return finish()
}

func rpcCtx(o *Options) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), seconds(o.RPCTimeout))
}

// launchInfo is Nomad's fingerprint launch (loader init.go fingerprintPlugin).
func launchInfo(o *Options, em *Emitter, logger hclog.Logger, logStats map[string]interface{}) (*basepb.ConfigSchemaResponse, string, bool) {
	l, err := startLaunch(1, o, em, logger)
	if err != nil {
		return nil, "", false
	}
	defer func() {
		l.Kill(em, true)
		logStats["launch1"] = l.logs.Stats()
	}()
	ctx, cancel := rpcCtx(o)
	defer cancel()
	info, err := l.stubs.base.PluginInfo(ctx, &basepb.PluginInfoRequest{})
	if err != nil {
		em.Violation("plugin_info.rpc", fmt.Sprintf("PluginInfo failed: %v", err), grpcError(err))
		return nil, "", false
	}
	found, apiVersion := validatePluginInfo(info)
	em.Emit("plugin_info", map[string]interface{}{
		"type": info.GetType().String(), "plugin_api_versions": info.GetPluginApiVersions(),
		"plugin_version": info.GetPluginVersion(), "name": info.GetName(), "api_version_selected": apiVersion,
	})
	for _, f := range found {
		em.Violation(f.Rule, f.Detail, nil)
	}
	if len(found) > 0 {
		return nil, "", false
	}
	ctx2, cancel2 := rpcCtx(o)
	defer cancel2()
	schema, err := l.stubs.base.ConfigSchema(ctx2, &basepb.ConfigSchemaRequest{})
	if err != nil {
		em.Violation("config_schema.rpc", fmt.Sprintf("ConfigSchema failed: %v", err), grpcError(err))
		return nil, "", false
	}
	specJSON := json.RawMessage("null")
	if schema.GetSpec() != nil {
		s, err := (&jsonpb.Marshaler{OrigName: true}).MarshalToString(schema.GetSpec())
		if err == nil {
			specJSON = json.RawMessage(s)
		}
	}
	em.Emit("config_schema", map[string]interface{}{"spec": specJSON, "has_spec": schema.GetSpec() != nil})
	if schema.GetSpec() == nil {
		return nil, apiVersion, true
	}
	return schema, apiVersion, true
}

// setConfig makes one SetConfig call and reports it.
func setConfig(o *Options, em *Emitter, l *Launch, call int, req *basepb.SetConfigRequest) bool {
	ctx, cancel := rpcCtx(o)
	defer cancel()
	t0 := time.Now()
	_, err := l.stubs.base.SetConfig(ctx, req)
	fields := map[string]interface{}{
		"ok": err == nil, "call": call, "seconds": time.Since(t0).Seconds(),
		"nomad_config": req.GetNomadConfig() != nil, "plugin_api_version": req.GetPluginApiVersion(),
		"msgpack_bytes": len(req.GetMsgpackConfig()),
	}
	if err != nil {
		for k, v := range grpcError(err) {
			fields[k] = v
		}
	}
	em.Emit("set_config", fields)
	switch {
	case err != nil && o.ExpectSetConfig == "ok":
		em.Violation("set_config.rejected", fmt.Sprintf("SetConfig call %d failed: %v (Nomad aborts agent start)", call, err), nil)
	case err == nil && o.ExpectSetConfig == "error" && l.n == 2 && call == 2:
		em.Violation("set_config.accepted", "SetConfig accepted a config the test expects to be rejected", nil)
	}
	return err == nil
}

// launchValidate is Nomad's config validation launch: Dispense (SetConfig
// without nomad_config), SetConfig again with the same bytes, kill.
func launchValidate(o *Options, em *Emitter, logger hclog.Logger, msgpack []byte, apiVersion string, logStats map[string]interface{}) bool {
	l, err := startLaunch(2, o, em, logger)
	if err != nil {
		return false
	}
	req := &basepb.SetConfigRequest{MsgpackConfig: msgpack, PluginApiVersion: apiVersion}
	ok := setConfig(o, em, l, 1, req) && setConfig(o, em, l, 2, req)
	l.Kill(em, true)
	logStats["launch2"] = l.logs.Stats()
	return ok
}
