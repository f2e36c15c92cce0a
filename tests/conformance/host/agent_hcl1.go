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
	"fmt"
	"io/ioutil"
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
