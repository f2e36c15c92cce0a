package main

// Checks the plugin's raw stderr lines against what go-plugin's log parser
// understands (go-plugin's `client.go`, `logStderr`). go-plugin itself forwards every
// line to the host's hclog logger (trace level, on our stderr); this
// writer only sees the same bytes via ClientConfig.Stderr and counts lines
// that Nomad would log verbatim at DEBUG instead of at their level.
// These are warnings, never violations: Nomad tolerates them.

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"time"
)

var hclogLevels = map[string]bool{"trace": true, "debug": true, "info": true, "warn": true, "error": true, "off": true}

type logChecker struct {
	mu        sync.Mutex
	em        *Emitter
	buf       bytes.Buffer
	sampleMax int
	total     int
	jsonOK    int
	nonJSON   int
	badLevel  int
	badTime   int
	samples   int
}

func newLogChecker(em *Emitter, sampleMax int) *logChecker {
	return &logChecker{em: em, sampleMax: sampleMax}
}

func (c *logChecker) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	for {
		i := bytes.IndexByte(c.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := string(c.buf.Next(i + 1))
		c.check(strings.TrimRight(line, "\r\n"))
	}
	return len(p), nil
}

func (c *logChecker) check(line string) {
	if strings.TrimSpace(line) == "" {
		return
	}
	c.total++
	var raw map[string]interface{}
	if err := json.Unmarshal([]byte(line), &raw); err != nil {
		c.nonJSON++
		c.sample("log.not_json", line)
		return
	}
	if ts, ok := raw["@timestamp"]; ok {
		s, _ := ts.(string)
		if _, err := time.Parse("2006-01-02T15:04:05.000000Z07:00", s); err != nil {
			c.badTime++
			c.sample("log.bad_timestamp", line)
			return
		}
	}
	lvl, _ := raw["@level"].(string)
	if !hclogLevels[strings.ToLower(strings.TrimSpace(lvl))] {
		c.badLevel++
		c.sample("log.unknown_level", line)
		return
	}
	c.jsonOK++
}

func (c *logChecker) sample(rule, line string) {
	if c.samples >= c.sampleMax {
		return
	}
	c.samples++
	if len(line) > 300 {
		line = line[:300] + "..."
	}
	c.em.Warning(rule, line)
}

// Stats returns the counters for the summary.
func (c *logChecker) Stats() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return map[string]int{
		"lines": c.total, "hclog_json": c.jsonOK, "not_json": c.nonJSON,
		"unknown_level": c.badLevel, "bad_timestamp": c.badTime,
	}
}
