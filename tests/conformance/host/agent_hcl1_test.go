package main

// Unit tests of the agent's HCL v1 reading (agent_hcl1.go).

import (
	"io/ioutil"
	"path/filepath"
	"strings"
	"testing"
)

func writeAgentFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.hcl")
	if err := ioutil.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHCL1LastPluginBlockWinsAndBlocksMerge(t *testing.T) {
	path := writeAgentFile(t, `
plugin "p" {
  config {
    a = "first"
  }
}
plugin "p" {
  args = ["-v"]
  config {
    b = 2
  }
  config {
    card { match = "3" mode = "tdm" }
  }
  unknown = true
}
`)
	pb, err := loadPluginBlockHCL1(path, "p")
	if err != nil {
		t.Fatal(err)
	}
	if !pb.Found || len(pb.Args) != 1 || pb.Args[0] != "-v" {
		t.Fatalf("block: %+v", pb)
	}
	if _, ok := pb.Config["a"]; ok {
		t.Errorf("the first block's config survived: %v", pb.Config)
	}
	if pb.Config["b"] != 2 {
		t.Errorf("b: %#v", pb.Config["b"])
	}
	cards, ok := pb.Config["card"].([]map[string]interface{})
	if !ok || len(cards) != 1 || cards[0]["mode"] != "tdm" || cards[0]["match"] != "3" {
		t.Errorf("card: %#v", pb.Config["card"])
	}
}

func TestHCL1RefusesABareWordWithTheAgentsMessage(t *testing.T) {
	path := writeAgentFile(t, "plugin \"p\" {\n  config {\n    mode = tdm\n  }\n}\n")
	_, err := loadPluginBlockHCL1(path, "p")
	if err == nil || !strings.Contains(err.Error(), "failed to decode HCL file") ||
		!strings.Contains(err.Error(), "Unknown token: 3:12 IDENT tdm") {
		t.Fatalf("want the agent's decode error, got %v", err)
	}
}
