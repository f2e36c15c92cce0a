package main

// The agent's own reading of its configuration file (Nomad's
// command/agent/config_parse.go, ParseConfigFile): HCL v1
// (github.com/hashicorp/hcl, Debian's golang-github-hashicorp-hcl-dev; Nomad
// pins a fork of the same v1 line) decodes the whole file into the agent's
// Config struct. A plugin block is {Name `hcl:",key"`, Args `hcl:"args"`,
// Config map[string]interface{} `hcl:"config"`, ExtraKeysHCL
// `hcl:",unusedKeys"`} (nomad/structs/config/plugins.go). helper.UnusedKeys
// does not descend into the Plugins slice, so unknown keys in a plugin block
// are ignored, as the agent ignores them. Several plugin blocks with one label
// leave the last one (helper/pluginutils/loader configMap).
//
// This is what `--agent-syntax hcl1` selects. The default, `hcl2`, is the
// HCL v2 native reading in config.go, kept as a second opinion: where the two
// differ, the agent follows this one.

import (
	"encoding/json"
	"fmt"
	"io"
	"io/ioutil"
	"os"
	"path/filepath"

	hcl1 "github.com/hashicorp/hcl"
)

type hcl1PluginConfig struct {
	Name         string                 `hcl:",key"`
	Args         []string               `hcl:"args"`
	Config       map[string]interface{} `hcl:"config"`
	ExtraKeysHCL []string               `hcl:",unusedKeys"`
}

type hcl1AgentConfig struct {
	Plugins []*hcl1PluginConfig `hcl:"plugin"`
}

// loadPluginBlockHCL1 reads the plugin block named `name` as the agent does.
// Its error text is the agent's: "failed to decode HCL file <abs path>: <hcl error>".
func loadPluginBlockHCL1(path, name string) (*pluginBlock, error) {
	pb := &pluginBlock{Config: map[string]interface{}{}}
	if path == "" {
		return pb, nil
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	src, err := ioutil.ReadFile(abs)
	if err != nil {
		return nil, err
	}
	var c hcl1AgentConfig
	if err := hcl1.Decode(&c, string(src)); err != nil {
		return nil, fmt.Errorf("failed to decode HCL file %s: %v", abs, err)
	}
	for _, p := range c.Plugins {
		if p == nil || p.Name != name {
			continue
		}
		pb.Found = true
		pb.Args = p.Args
		pb.Config = p.Config
		if pb.Config == nil {
			pb.Config = map[string]interface{}{}
		}
	}
	return pb, nil
}

// agentFileFields is what `conformance-host agent-file FILE...` reports of an
// agent file: the top-level data_dir and plugin_dir (Nomad's Config fields
// `hcl:"data_dir"` and `hcl:"plugin_dir"`, command/agent/config.go) and the
// plugin blocks, decoded by the same HCL v1 call the agent makes (hcl.Decode).
type agentFileFields struct {
	DataDir   string              `hcl:"data_dir"`
	PluginDir string              `hcl:"plugin_dir"`
	Plugins   []*hcl1PluginConfig `hcl:"plugin"`
}

// readAgentFile decodes one file; a panic inside the decoder (HCL v1 panics
// on some literals it scanned but cannot convert) is a refusal too: the agent
// would stop there.
func readAgentFile(src string) (out map[string]interface{}) {
	defer func() {
		if r := recover(); r != nil {
			out = map[string]interface{}{"ok": false, "error": fmt.Sprintf("panic: %v", r)}
		}
	}()
	var c agentFileFields
	if err := hcl1.Decode(&c, src); err != nil {
		return map[string]interface{}{"ok": false, "error": err.Error()}
	}
	plugins := []interface{}{}
	for _, p := range c.Plugins {
		if p == nil {
			continue
		}
		args := p.Args
		if args == nil {
			args = []string{}
		}
		plugins = append(plugins, map[string]interface{}{"name": p.Name, "args": args, "config": p.Config})
	}
	// The agent's own default (command/agent/command.go): plugin_dir, else <data_dir>/plugins.
	effective := c.PluginDir
	if effective == "" && c.DataDir != "" {
		effective = filepath.Join(c.DataDir, "plugins")
	}
	return map[string]interface{}{
		"ok": true, "data_dir": c.DataDir, "plugin_dir": c.PluginDir, "effective_plugin_dir": effective, "plugins": plugins,
	}
}

// dumpAgentFiles prints one JSON line per file: {"file", "ok", "error"} or
// {"file", "ok", "data_dir", "plugin_dir", "effective_plugin_dir", "plugins": [{"name", "args", "config"}]}.
func dumpAgentFiles(paths []string, w io.Writer) int {
	enc := json.NewEncoder(w)
	for _, path := range paths {
		src, err := ioutil.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conformance-host agent-file:", err)
			return 2
		}
		out := readAgentFile(string(src))
		out["file"] = path
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, "conformance-host agent-file:", err)
			return 2
		}
	}
	return 0
}
