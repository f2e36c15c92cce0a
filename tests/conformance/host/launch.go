package main

// Starting and stopping the plugin process exactly the way Nomad's plugin
// loader does (go-plugin client, Nomad's handshake, gRPC only, plugin map
// {"base"} for the fingerprint launch and {"base","device"} afterwards).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	basepb "lingjunconf/pb/base"
	devicepb "lingjunconf/pb/device"
)

// nomadHandshake is Nomad's plugins/base.Handshake.
var nomadHandshake = plugin.HandshakeConfig{
	ProtocolVersion:  2,
	MagicCookieKey:   "NOMAD_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255",
}

// stubs is what Dispense returns: the gRPC clients on the shared connection.
// Like Nomad, dispensing makes no RPC; the names never go on the wire.
type stubs struct {
	base   basepb.BasePluginClient
	device devicepb.DevicePluginClient
}

// nomadPlugin implements plugin.GRPCPlugin for the host side only.
type nomadPlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (nomadPlugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("conformance host only implements the client side")
}

func (nomadPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return &stubs{base: basepb.NewBasePluginClient(c), device: devicepb.NewDevicePluginClient(c)}, nil
}

// Launch is one plugin process.
type Launch struct {
	n       int
	client  *plugin.Client
	cmd     *exec.Cmd
	stubs   *stubs
	addr    net.Addr
	started time.Time
	logs    *logChecker
}

// startLaunch launches the plugin and dispenses `dispense` ("base" for
// launch 1, "device" for launches 2 and 3). On failure a violation is
// emitted and the process (if any) is killed.
func startLaunch(n int, o *Options, em *Emitter, logger hclog.Logger) (*Launch, error) {
	em.SetLaunch(n)
	plugins := map[string]plugin.Plugin{"base": nomadPlugin{}}
	dispense := "base"
	if n > 1 {
		plugins["device"] = nomadPlugin{}
		dispense = "device"
	}
	cmd := exec.Command(o.Plugin, o.PluginArgs...)
	// Test hygiene only (Nomad does not do this): if the host dies, the
	// kernel kills the plugin instead of leaving it orphaned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logs := newLogChecker(em, o.LogSampleMax)
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  nomadHandshake,
		Plugins:          plugins,
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
		Stderr:           logs,
	})
	l := &Launch{n: n, client: client, cmd: cmd, started: time.Now(), logs: logs}
	t0 := time.Now()
	rpc, err := client.Client()
	if err != nil {
		em.Violation("handshake", fmt.Sprintf("go-plugin client failed to start the plugin: %v", err), nil)
		client.Kill()
		return nil, err
	}
	raw, err := rpc.Dispense(dispense)
	if err != nil {
		em.Violation("handshake", fmt.Sprintf("dispense %q failed: %v", dispense, err), nil)
		client.Kill()
		return nil, err
	}
	l.stubs = raw.(*stubs)
	if rc := client.ReattachConfig(); rc != nil {
		l.addr = rc.Addr
	}
	fields := map[string]interface{}{
		"pid":               l.pid(),
		"negotiated":        client.NegotiatedVersion(),
		"protocol":          string(client.Protocol()),
		"handshake_seconds": time.Since(t0).Seconds(),
		"dispensed":         dispense,
	}
	if l.addr != nil {
		fields["network"] = l.addr.Network()
		fields["address"] = l.addr.String()
	}
	em.Emit("launch", fields)
	return l, nil
}

func (l *Launch) pid() int {
	if l.cmd.Process == nil {
		return 0
	}
	return l.cmd.Process.Pid
}

// Kill stops the plugin the way Nomad does (Client.Kill: GRPCController
// Shutdown, close the connection, wait up to 2 s, else SIGKILL) and reports
// whether the exit was graceful and whether the unix socket was removed.
func (l *Launch) Kill(em *Emitter, checkSocket bool) {
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		l.client.Kill()
		close(done)
	}()
	hung := false
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		hung = true
	}
	secs := time.Since(t0).Seconds()
	fields := map[string]interface{}{"seconds": secs, "pid": l.pid()}
	if hung {
		em.Violation("shutdown.kill_hung",
			"go-plugin Kill did not return within 10 s (something still holds the plugin's stdout/stderr pipes, e.g. a child process)", nil)
		fields["graceful"] = false
		em.Emit("shutdown", fields)
		return
	}
	graceful := true
	if ps := l.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			fields["exit_code"] = ws.ExitStatus()
			if ws.Signaled() {
				fields["signal"] = ws.Signal().String()
				graceful = false
			}
		}
	}
	if secs >= 2.0 {
		graceful = false
	}
	fields["graceful"] = graceful
	if !graceful {
		em.Violation("shutdown.not_graceful",
			fmt.Sprintf("plugin did not exit within 2 s of GRPCController.Shutdown (took %.3f s; Nomad SIGKILLs it)", secs), nil)
	}
	if checkSocket && l.addr != nil && l.addr.Network() == "unix" {
		path := l.addr.String()
		_, err := os.Stat(path)
		gone := os.IsNotExist(err)
		fields["socket_removed"] = gone
		if !gone {
			em.Violation("shutdown.socket_left", fmt.Sprintf("plugin socket %s still exists after exit", path), nil)
		}
	}
	em.Emit("shutdown", fields)
}
