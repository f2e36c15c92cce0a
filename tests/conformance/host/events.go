package main

// JSON-lines event output. Every observation is one line on stdout so that
// pytest (or a soak driver) can read the stream while the host still runs.

import (
	"bufio"
	"encoding/json"
	"os"
	"sort"
	"sync"
	"time"
)

// Emitter writes events and counts violations. It is safe for concurrent
// use by the stream goroutines.
type Emitter struct {
	mu         sync.Mutex
	out        *bufio.Writer
	start      time.Time
	launch     int
	violations int
	warnings   int
	rules      map[string]int
	counts     map[string]int
}

func newEmitter() *Emitter {
	return &Emitter{
		out:    bufio.NewWriter(os.Stdout),
		start:  time.Now(),
		rules:  map[string]int{},
		counts: map[string]int{},
	}
}

// SetLaunch records which launch (1 info, 2 validate, 3 run) later events
// belong to.
func (e *Emitter) SetLaunch(n int) {
	e.mu.Lock()
	e.launch = n
	e.mu.Unlock()
}

// Emit writes one event line; fields may be nil.
func (e *Emitter) Emit(event string, fields map[string]interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.emitLocked(event, fields)
}

func (e *Emitter) emitLocked(event string, fields map[string]interface{}) {
	rec := make(map[string]interface{}, len(fields)+4)
	for k, v := range fields {
		rec[k] = v
	}
	now := time.Now()
	rec["event"] = event
	rec["t_mono_ns"] = now.Sub(e.start).Nanoseconds()
	rec["t_wall_ns"] = now.UnixNano()
	rec["launch"] = e.launch
	line, err := json.Marshal(rec)
	if err != nil {
		line, _ = json.Marshal(map[string]interface{}{
			"event": "emit_error", "for": event, "error": err.Error(),
		})
	}
	e.counts[event]++
	e.out.Write(line)
	e.out.WriteByte('\n')
	e.out.Flush()
}

// Violation records a breach of a rule Nomad enforces (or of the plugin
// contract Nomad relies on). Any violation makes the host exit 1.
func (e *Emitter) Violation(rule, detail string, extra map[string]interface{}) {
	fields := map[string]interface{}{"rule": rule, "detail": detail}
	for k, v := range extra {
		fields[k] = v
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.violations++
	e.rules[rule]++
	e.emitLocked("violation", fields)
}

// Warning records something Nomad tolerates but that is likely a defect.
func (e *Emitter) Warning(rule, detail string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.warnings++
	e.emitLocked("warning", map[string]interface{}{"rule": rule, "detail": detail})
}

// Violations returns the number of violations so far.
func (e *Emitter) Violations() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.violations
}

// Summary writes the final event.
func (e *Emitter) Summary(extra map[string]interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rules := make([]string, 0, len(e.rules))
	for r := range e.rules {
		rules = append(rules, r)
	}
	sort.Strings(rules)
	counts := map[string]int{}
	for k, v := range e.counts {
		counts[k] = v
	}
	fields := map[string]interface{}{
		"violations":      e.violations,
		"warnings":        e.warnings,
		"violated_rules":  rules,
		"event_counts":    counts,
		"elapsed_seconds": time.Since(e.start).Seconds(),
	}
	for k, v := range extra {
		fields[k] = v
	}
	e.emitLocked("summary", fields)
}
