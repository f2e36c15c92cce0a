package main

// Launch 3: the device manager's long-lived instance (client/devicemanager
// instance.go): SetConfig with nomad_config, one Fingerprint stream for the
// plugin's lifetime, Stats after the first fingerprint, Reserve calls as
// tasks start, Kill at agent shutdown.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	durpb "github.com/golang/protobuf/ptypes/duration"
	hclog "github.com/hashicorp/go-hclog"

	basepb "lingjunconf/pb/base"
	devicepb "lingjunconf/pb/device"
)

// fpGroup is one fingerprinted group as the device manager keeps it.
type fpGroup struct {
	key     string
	ids     map[string]bool
	healthy []string // in message order
}

type runner struct {
	o  *Options
	em *Emitter
	l  *Launch

	ctx    context.Context
	cancel context.CancelFunc

	stopping int32

	mu       sync.Mutex
	fpSeq    int
	latest   []fpGroup
	previous []fpGroup
	firstFP  chan struct{}
	fpDone   chan struct{}
	statsSeq int
	lastStat time.Time

	reserves sync.WaitGroup

	// The automatic Reserve (--reserve-count / --reserve-ids) waits for a
	// condition, never for a message count: the first fingerprint that holds
	// the devices fires it; --reserve-timeout, the end of the fingerprint
	// stream or of the run abandons it with a message naming what was awaited.
	autoSettled chan struct{} // closed once the auto reserve fired or was abandoned
	autoDone    bool          // guarded by mu
	autoLast    string        // the latest fingerprint, summarised; guarded by mu
}

func (r *runner) isStopping() bool { return atomic.LoadInt32(&r.stopping) == 1 }

// runtimeNomadConfig is what NomadPluginConfig(topology) sends: the driver
// section with the client's port range and a topology.
func runtimeNomadConfig() *basepb.NomadConfig {
	return &basepb.NomadConfig{Driver: &basepb.NomadDriverConfig{
		ClientMinPort: 14000,
		ClientMaxPort: 14512,
		Topology: &basepb.ClientTopology{
			NodeIds:   []uint32{0},
			Distances: &basepb.ClientTopologySLIT{Dimension: 1, Values: []uint32{10}},
			Cores: []*basepb.ClientTopologyCore{
				{SocketId: 0, NodeId: 0, CoreId: 0, CoreGrade: basepb.CoreGrade_Performance, BaseSpeed: 2400, MaxSpeed: 3500},
				{SocketId: 0, NodeId: 0, CoreId: 1, CoreGrade: basepb.CoreGrade_Performance, BaseSpeed: 2400, MaxSpeed: 3500},
			},
		},
	}}
}

func launchRun(o *Options, em *Emitter, logger hclog.Logger, msgpack []byte, apiVersion string, logStats map[string]interface{}) {
	l, err := startLaunch(3, o, em, logger)
	if err != nil {
		return
	}
	r := &runner{o: o, em: em, l: l, firstFP: make(chan struct{}), fpDone: make(chan struct{}), autoSettled: make(chan struct{})}
	r.autoLast = "no fingerprint yet"
	r.ctx, r.cancel = context.WithCancel(context.Background())
	defer func() { logStats["launch3"] = l.logs.Stats() }()

	req := &basepb.SetConfigRequest{MsgpackConfig: msgpack, PluginApiVersion: apiVersion, NomadConfig: runtimeNomadConfig()}
	if !setConfig(o, em, l, 1, req) {
		atomic.StoreInt32(&r.stopping, 1)
		l.Kill(em, true)
		r.cancel()
		return
	}
	timer := time.AfterFunc(seconds(o.ReserveTimeout), func() {
		r.abandonAuto(fmt.Sprintf("none within --reserve-timeout %.1f s", o.ReserveTimeout))
	})
	defer timer.Stop()
	go r.fingerprintLoop()
	if reason := r.waitLoop(); reason == "duration" {
		// --duration is how long to watch, not a deadline for the plugin to
		// come up: a pending auto reserve is still awaited (bounded by the timer).
		if r.autoWanted() {
			select {
			case <-r.autoSettled:
			case <-r.fpDone:
			}
		}
	} else {
		r.abandonAuto("the run ended first (" + reason + ")")
	}

	r.reserves.Wait()
	atomic.StoreInt32(&r.stopping, 1)
	l.Kill(em, true)
	r.cancel()
}

// waitLoop runs until --duration elapses, a stop command arrives, the
// fingerprint stream dies, or the first fingerprint does not come in time.
// It returns the reason it emitted in its run_end event.
func (r *runner) waitLoop() string {
	var deadline <-chan time.Time
	if r.o.Duration > 0 {
		deadline = time.After(seconds(r.o.Duration))
	}
	firstTimeout := time.After(seconds(r.o.FirstFPTimeout))
	var cmds <-chan map[string]interface{}
	if r.o.Stdin {
		cmds = readCommands(r.em)
	} else if r.o.Duration <= 0 {
		r.em.Emit("error", map[string]interface{}{"error": "--duration <= 0 needs --stdin; running 3 s"})
		deadline = time.After(3 * time.Second)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	gotFirst := r.firstFP
	for {
		select {
		case <-deadline:
			return r.endRun("duration")
		case s := <-sigs:
			return r.endRun("signal " + s.String())
		case <-r.fpDone:
			return r.endRun("fingerprint stream ended")
		case <-gotFirst:
			gotFirst, firstTimeout = nil, nil
		case <-firstTimeout:
			r.em.Violation("fingerprint.none_received", fmt.Sprintf("no fingerprint within %.1f s", r.o.FirstFPTimeout), nil)
			return r.endRun("no first fingerprint")
		case c, ok := <-cmds:
			if !ok {
				cmds = nil
				if r.o.Duration <= 0 {
					return r.endRun("stdin closed")
				}
				continue
			}
			if r.handleCommand(c) {
				return r.endRun("stop command")
			}
		}
	}
}

func (r *runner) endRun(reason string) string {
	r.em.Emit("run_end", map[string]interface{}{"reason": reason})
	return reason
}

func readCommands(em *Emitter) <-chan map[string]interface{} {
	ch := make(chan map[string]interface{})
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			var c map[string]interface{}
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				em.Emit("command_error", map[string]interface{}{"error": "not a JSON object: " + err.Error(), "line": line})
				continue
			}
			ch <- c
		}
	}()
	return ch
}

// handleCommand runs one stdin command; it returns true for "stop".
func (r *runner) handleCommand(c map[string]interface{}) bool {
	op, _ := c["op"].(string)
	switch op {
	case "stop":
		return true
	case "echo":
		r.em.Emit("echo", map[string]interface{}{"data": c["data"]})
	case "reserve":
		var ids []string
		raw, _ := c["ids"].([]interface{})
		for _, v := range raw {
			s, ok := v.(string)
			if !ok {
				r.em.Emit("command_error", map[string]interface{}{"error": "ids must be strings", "command": c})
				return false
			}
			ids = append(ids, s)
		}
		expect, _ := c["expect"].(string)
		if expect == "" {
			expect = "any"
		}
		r.reserves.Add(1)
		go func() {
			defer r.reserves.Done()
			r.reserve(ids, expect, c["tag"], "stdin")
		}()
	default:
		r.em.Emit("command_error", map[string]interface{}{"error": fmt.Sprintf("unknown op %q", op), "command": c})
	}
	return false
}

func (r *runner) fingerprintLoop() {
	stream, err := r.l.stubs.device.Fingerprint(r.ctx, &devicepb.FingerprintRequest{})
	if err != nil {
		r.streamFailed("fingerprint", err)
		close(r.fpDone)
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			r.streamFailed("fingerprint", err)
			r.abandonAuto("the fingerprint stream ended")
			close(r.fpDone)
			return
		}
		recv := time.Now()
		r.mu.Lock()
		r.fpSeq++
		seq := r.fpSeq
		r.previous = r.latest
		r.latest = indexGroups(resp)
		groups := r.latest
		r.autoLast = fmt.Sprintf("fingerprint #%d: %s", seq, describeGroups(groups))
		r.mu.Unlock()

		violations, warnings := validateFingerprint(resp)
		devices := 0
		for _, g := range resp.GetDeviceGroup() {
			devices += len(g.GetDevices())
		}
		r.em.Emit("fingerprint", map[string]interface{}{
			"seq": seq, "groups": renderFingerprint(resp), "n_groups": len(resp.GetDeviceGroup()),
			"n_devices": devices, "recv_unix_ns": recv.UnixNano(), "valid": len(violations) == 0,
		})
		for _, f := range violations {
			r.em.Violation(f.Rule, f.Detail, map[string]interface{}{"seq": seq})
		}
		for _, f := range warnings {
			r.em.Warning(f.Rule, f.Detail)
		}
		if seq == 1 {
			close(r.firstFP)
			go r.statsLoop()
		}
		if r.autoWanted() && seq >= r.o.ReserveAfterFP {
			if ids, ok := r.autoPick(groups); ok && r.settleAuto(true) {
				go func() {
					defer r.reserves.Done()
					r.reserve(ids, r.o.ExpectReserve, nil, "auto")
				}()
			}
		}
	}
}

func indexGroups(resp *devicepb.FingerprintResponse) []fpGroup {
	var out []fpGroup
	for _, g := range resp.GetDeviceGroup() {
		fg := fpGroup{key: groupKey(g.GetVendor(), g.GetDeviceType(), g.GetDeviceName()), ids: map[string]bool{}}
		for _, d := range g.GetDevices() {
			fg.ids[d.GetID()] = true
			if d.GetHealthy() {
				fg.healthy = append(fg.healthy, d.GetID())
			}
		}
		out = append(out, fg)
	}
	return out
}

// streamFailed reports the end of a stream Nomad keeps open for the plugin's
// lifetime; after Kill started, the end is expected.
func (r *runner) streamFailed(name string, err error) {
	if r.isStopping() {
		return
	}
	if err == io.EOF {
		r.em.Violation(name+".stream_ended",
			fmt.Sprintf("the plugin ended the %s stream (Nomad then stops using the plugin for good)", name), nil)
		return
	}
	r.em.Violation(name+".stream_error", fmt.Sprintf("%s stream failed: %v", name, err), grpcError(err))
}

func (r *runner) statsLoop() {
	req := &devicepb.StatsRequest{CollectionInterval: durationProto(seconds(r.o.StatsInterval))}
	stream, err := r.l.stubs.device.Stats(r.ctx, req)
	if err != nil {
		r.streamFailed("stats", err)
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			r.streamFailed("stats", err)
			return
		}
		now := time.Now()
		r.mu.Lock()
		r.statsSeq++
		seq := r.statsSeq
		var gap float64
		if !r.lastStat.IsZero() {
			gap = now.Sub(r.lastStat).Seconds()
		}
		r.lastStat = now
		known := r.knownLocked()
		r.mu.Unlock()
		groups, n := renderStats(resp, r.o.StatsDetail)
		r.em.Emit("stats", map[string]interface{}{
			"seq": seq, "groups": groups, "n_instances": n, "since_prev_seconds": gap, "recv_unix_ns": now.UnixNano(),
		})
		// Fingerprint and Stats are separate streams, received here by separate
		// goroutines: a Stats message naming a group that a Fingerprint message
		// sent just before it introduces can be processed first. Judge it again
		// against the fingerprints received within a short grace before calling
		// it a violation (Nomad itself never checks stats against fingerprints).
		findings := validateStats(resp, known)
		for deadline := now.Add(statsRaceGrace); len(findings) > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			r.mu.Lock()
			known = r.knownLocked()
			r.mu.Unlock()
			findings = validateStats(resp, known)
		}
		for _, f := range findings {
			r.em.Violation(f.Rule, f.Detail, map[string]interface{}{"seq": seq})
		}
	}
}

// statsRaceGrace is how long a stats message may lead the fingerprint that
// introduces its groups (cross-stream delivery order); far below any interval.
const statsRaceGrace = 250 * time.Millisecond

// knownLocked maps group key -> IDs from the latest and previous fingerprint
// (a stats message may also lag a fingerprint change). Callers hold r.mu.
func (r *runner) knownLocked() map[string]map[string]bool {
	known := map[string]map[string]bool{}
	for _, set := range [][]fpGroup{r.previous, r.latest} {
		for _, g := range set {
			if known[g.key] == nil {
				known[g.key] = map[string]bool{}
			}
			for id := range g.ids {
				known[g.key][id] = true
			}
		}
	}
	return known
}

func durationProto(d time.Duration) *durpb.Duration {
	return &durpb.Duration{Seconds: int64(d / time.Second), Nanos: int32(d % time.Second)}
}

func (r *runner) autoWanted() bool { return r.o.ReserveCount > 0 || r.o.ReserveIDs != "" }

// autoPick returns the IDs the automatic Reserve asks for once this
// fingerprint holds them: every --reserve-ids in one group, or the first
// --reserve-count healthy IDs of the chosen group (as the scheduler picks).
func (r *runner) autoPick(groups []fpGroup) ([]string, bool) {
	if r.o.ReserveIDs != "" {
		ids := strings.Split(r.o.ReserveIDs, ",")
		for _, g := range groups {
			all := true
			for _, id := range ids {
				all = all && g.ids[id]
			}
			if all {
				return ids, true
			}
		}
		return nil, false
	}
	for _, g := range groups {
		if r.o.ReserveGroup == "" || g.key == r.o.ReserveGroup {
			if len(g.healthy) < r.o.ReserveCount {
				return nil, false
			}
			return append([]string{}, g.healthy[:r.o.ReserveCount]...), true
		}
	}
	return nil, false
}

// awaited names the condition the automatic Reserve waits for.
func (r *runner) awaited() string {
	if r.o.ReserveIDs != "" {
		return fmt.Sprintf("a fingerprint in which one group holds all of %s", r.o.ReserveIDs)
	}
	group := "the first group"
	if r.o.ReserveGroup != "" {
		group = "group " + r.o.ReserveGroup
	}
	return fmt.Sprintf("a fingerprint in which %s holds %d healthy devices", group, r.o.ReserveCount)
}

// settleAuto marks the automatic Reserve as decided; false if it already was.
// When it fires the Reserve it counts it in r.reserves first, under the same
// lock: launchRun only Waits once the decision is made, so no Add can race it.
func (r *runner) settleAuto(fire bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.autoDone {
		return false
	}
	r.autoDone = true
	if fire {
		r.reserves.Add(1)
	}
	close(r.autoSettled)
	return true
}

// abandonAuto reports an automatic Reserve that never became possible.
func (r *runner) abandonAuto(reason string) {
	if !r.autoWanted() || !r.settleAuto(false) {
		return
	}
	r.mu.Lock()
	last := r.autoLast
	r.mu.Unlock()
	msg := fmt.Sprintf("awaited %s after fingerprint #%d: %s; last seen: %s", r.awaited(), r.o.ReserveAfterFP, reason, last)
	r.em.Emit("reserve", map[string]interface{}{"ok": false, "source": "auto", "error": msg, "called": false})
	r.em.Violation("reserve.no_devices", msg, nil)
}

// describeGroups summarises a fingerprint for abandonAuto's message.
func describeGroups(groups []fpGroup) string {
	if len(groups) == 0 {
		return "no device groups"
	}
	parts := make([]string, 0, len(groups))
	for _, g := range groups {
		parts = append(parts, fmt.Sprintf("%s with %d devices, %d healthy", g.key, len(g.ids), len(g.healthy)))
	}
	return strings.Join(parts, "; ")
}

// nomadWouldCall: the device manager only calls Reserve when one group of
// the latest fingerprint holds every requested ID.
func (r *runner) nomadWouldCall(ids []string) (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.latest {
		all := len(ids) > 0
		for _, id := range ids {
			if !g.ids[id] {
				all = false
				break
			}
		}
		if all {
			return true, g.key
		}
	}
	return false, ""
}

func (r *runner) reserve(ids []string, expect string, tag interface{}, source string) {
	would, group := r.nomadWouldCall(ids)
	ctx, cancel := context.WithTimeout(r.ctx, seconds(r.o.RPCTimeout))
	defer cancel()
	t0 := time.Now()
	resp, err := r.l.stubs.device.Reserve(ctx, &devicepb.ReserveRequest{DeviceIds: ids})
	fields := map[string]interface{}{
		"ok": err == nil, "ids": ids, "source": source, "tag": tag, "called": true,
		"nomad_would_call": would, "group": group, "seconds": time.Since(t0).Seconds(),
	}
	var findings []Finding
	if err != nil {
		for k, v := range grpcError(err) {
			fields[k] = v
		}
		if ctx.Err() == context.DeadlineExceeded {
			findings = append(findings, Finding{"reserve.timeout",
				fmt.Sprintf("Reserve did not answer within %.1f s (Nomad waits forever and the task never starts)", r.o.RPCTimeout)})
		}
	} else {
		for k, v := range renderReservation(resp) {
			fields[k] = v
		}
		findings = append(findings, validateReservation(resp)...)
	}
	r.em.Emit("reserve", fields)
	for _, f := range findings {
		r.em.Violation(f.Rule, f.Detail, map[string]interface{}{"ids": ids})
	}
	switch {
	case expect == "ok" && err != nil:
		r.em.Violation("reserve.unexpected_error", fmt.Sprintf("Reserve(%v) failed: %v", ids, err), map[string]interface{}{"tag": tag})
	case expect == "error" && err == nil:
		r.em.Violation("reserve.unexpected_success", fmt.Sprintf("Reserve(%v) succeeded but an error was expected", ids), map[string]interface{}{"tag": tag})
	}
}
