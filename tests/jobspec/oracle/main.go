// Command go-oracle answers questions with Go's own functions, so that the
// Python readings in nomad_plugin/jobspec can be compared with the reference
// rather than with a reading of it.
//
// One JSON request per line on stdin, one JSON answer per line on stdout, in
// order. Requests name an "op":
//
//	info                       toolchain and library versions in this build
//	parse_int/parse_float/parse_bool/trim_space   {"s"}: strconv / strings
//	regexp                     {"s": pattern, "texts": [...]}: regexp.Compile + MatchString
//	version                    {"s"}: go-version NewVersion and NewSemver
//	constraint                 {"s", "versions": [...]}: NewConstraint + Check,
//	                           each version read by NewVersion (as Nomad's checkVersionMatch)
//	hcl_syntax, hcl_eval       hcl.go: hclsyntax's diagnostics and expression values
//
// Nomad's own semver constraints and attribute code are not packaged by
// Debian, so they have no Go answer here (see README.md).
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	version "github.com/hashicorp/go-version"
)

// Set by the build helper (-ldflags -X): the go-version release built in.
var goVersionSource = "unknown"

type request struct {
	Op       string          `json:"op"`
	S        string          `json:"s"`
	Texts    []string        `json:"texts"`
	Versions []string        `json:"versions"`
	Vars     json.RawMessage `json:"vars"`
}

type answer map[string]any

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func versionAnswer(v *version.Version, err error) answer {
	if err != nil {
		return answer{"ok": false, "err": err.Error()}
	}
	return answer{
		"ok": true, "string": v.String(), "segments": v.Segments64(),
		"pre": v.Prerelease(), "meta": v.Metadata(),
	}
}

func handle(req request) answer {
	switch req.Op {
	case "info":
		return answer{"go": runtime.Version(), "go_version_source": goVersionSource}
	case "parse_int":
		i, err := strconv.ParseInt(req.S, 10, 64)
		return answer{"ok": err == nil, "int": i, "err": errText(err)}
	case "parse_float":
		f, err := strconv.ParseFloat(req.S, 64)
		return answer{"ok": err == nil, "bits": math.Float64bits(f), "nan": math.IsNaN(f), "err": errText(err)}
	case "parse_bool":
		b, err := strconv.ParseBool(req.S)
		return answer{"ok": err == nil, "bool": b, "err": errText(err)}
	case "trim_space":
		return answer{"out": strings.TrimSpace(req.S)}
	case "regexp":
		re, err := regexp.Compile(req.S)
		if err != nil {
			return answer{"ok": false, "err": err.Error()}
		}
		matches := make([]bool, len(req.Texts))
		for i, text := range req.Texts {
			matches[i] = re.MatchString(text)
		}
		return answer{"ok": true, "matches": matches}
	case "version":
		loose := versionAnswer(version.NewVersion(req.S))
		loose["semver"] = versionAnswer(version.NewSemver(req.S))
		return loose
	case "constraint":
		c, err := version.NewConstraint(req.S)
		if err != nil {
			return answer{"ok": false, "err": err.Error()}
		}
		checks := make([]any, len(req.Versions))
		for i, text := range req.Versions {
			if v, err := version.NewVersion(text); err == nil {
				checks[i] = c.Check(v)
			}
		}
		return answer{"ok": true, "checks": checks}
	}
	return hclOp(req)
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans = answer{"error": "bad request: " + err.Error()}
		} else {
			ans = handle(req)
		}
		if err := enc.Encode(ans); err != nil {
			fmt.Fprintln(os.Stderr, "go-oracle:", err)
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "go-oracle:", err)
		os.Exit(1)
	}
}
