package node

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/sshd"
)

// TestConnected: only a check that ran and saw the connection refused, unroutable or timed out
// says "does not answer"; a check that could not run is an error, never "gone".
func TestConnected(t *testing.T) {
	target := netip.MustParseAddrPort("192.0.2.31:10250")
	for _, c := range []struct {
		status int
		stderr string
		want   bool
		err    string
	}{
		{0, "", true, ""},
		{1, "bash: connect: Connection refused\nbash: line 1: /dev/tcp/192.0.2.31/10250: Connection refused\n", false, ""},
		{1, "bash: connect: No route to host\n", false, ""},
		{124, "", false, ""},
		{127, "timeout: failed to run command 'bash': No such file or directory\n", false, "exited 127: timeout: failed to run command 'bash'"},
		{126, "timeout: failed to run command 'bash': Permission denied\n", false, "exited 126"},
		{125, "timeout: invalid time interval\n", false, "exited 125"},
		{1, "bash: /dev/tcp/192.0.2.31/10250: Invalid argument\n", false, "exited 1: bash: /dev/tcp/192.0.2.31/10250: Invalid argument"},
	} {
		got, err := connected(sshx.Result{Command: "timeout 5 bash -c …", ExitStatus: c.status, Stderr: []byte(c.stderr)}, target)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("exit %d %q: %v, %v; want %v", c.status, c.stderr, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "kip cannot tell whether it answers")):
			t.Errorf("exit %d %q: %v, %v; want an error with %q", c.status, c.stderr, got, err, c.err)
		}
	}
}

// TestConnectsOverSSH runs the check through a real sshd and bash: a listening port answers, a
// closed one does not.
func TestConnectsOverSSH(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := dialThisMachine(ctx, t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(l.Addr().String())
	if ok, err := Connects(ctx, c, addr.Addr(), int(addr.Port())); err != nil || !ok {
		t.Errorf("a listening port: %v, %v; want it answers", ok, err)
	}
	l.Close()
	if ok, err := Connects(ctx, c, addr.Addr(), int(addr.Port())); err != nil || ok {
		t.Errorf("a closed port: %v, %v; want it does not answer", ok, err)
	}
	// A private path whose node SSH port is closed: the join names --public only while it may
	// still choose public addresses (the cluster's first join).
	p := cluster.Path{Mode: cluster.ModePrivate, Network: netip.MustParsePrefix("127.0.0.0/8"), Server: addr.Addr(), Node: addr.Addr()}
	for _, first := range []bool{true, false} {
		err := CheckPath(ctx, c, c, p, int(addr.Port()), first)
		if err == nil || !strings.Contains(err.Error(), "the server cannot connect to the node's SSH port") || strings.Contains(err.Error(), "--public") != first {
			t.Errorf("CheckPath, first join %v: %v", first, err)
		}
	}
}

// TestIdentity: a host is the worker only when its name, the machine ID its node's kubelet
// reported and the node its k3s configuration registers all agree with what kip recorded.
func TestIdentity(t *testing.T) {
	w := cluster.Worker{Host: "192.0.2.41", Path: cluster.Path{Node: netip.MustParseAddr("10.0.0.41")}}
	n := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{MachineID: "m-41"}}}
	good := hostIdentity{Hostname: "w41", MachineID: "m-41", NodeName: "w41", NodeIP: "10.0.0.41", Configured: true}
	if err := checkIdentity(good, "w41", w, n); err != nil {
		t.Errorf("the worker itself: %v", err)
	}
	wiped := good
	wiped.Configured, wiped.NodeName, wiped.NodeIP = false, "", ""
	if err := checkIdentity(wiped, "w41", w, nil); err != nil {
		t.Errorf("the worker, wiped and its node gone: %v", err)
	}
	for _, c := range []struct {
		change func(*hostIdentity)
		want   string
	}{
		{func(id *hostIdentity) { id.Hostname = "w42" }, `it is named "w42"`},
		{func(id *hostIdentity) { id.MachineID = "m-42" }, "its machine ID is m-42 where node w41 reported m-41"},
		{func(id *hostIdentity) { id.NodeIP = "10.0.0.42" }, `its k3s registers node "w41" at "10.0.0.42", not w41 at 10.0.0.41`},
	} {
		id := good
		c.change(&id)
		err := checkIdentity(id, "w41", w, n)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the host at 192.0.2.41 is not worker w41") {
			t.Errorf("checkIdentity(%+v) = %v, want %q", id, err, c.want)
		}
	}
}

// TestReadIdentityOverSSH reads a real host's identity (this machine's, through sshd): its name,
// /etc/machine-id, boot ID and architecture; it has no k3s configuration.
func TestReadIdentityOverSSH(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := dialThisMachine(ctx, t)
	id, err := readIdentity(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	hostname, _ := os.Hostname()
	machineID, _ := os.ReadFile("/etc/machine-id")
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if id.Hostname != hostname || id.MachineID != strings.TrimSpace(string(machineID)) || id.BootID != strings.TrimSpace(string(boot)) || id.Arch == "" {
		t.Errorf("identity %+v; want name %s, machine ID %s, boot %s", id, hostname, machineID, boot)
	}
	if _, err := os.Stat("/etc/rancher/k3s/config.yaml"); os.IsNotExist(err) && id.Configured {
		t.Errorf("identity %+v has a k3s configuration this machine does not have", id)
	}
}

// dialThisMachine logs in to this machine through a real sshd, until t ends.
func dialThisMachine(ctx context.Context, t *testing.T) *sshx.Client {
	t.Helper()
	srv := sshd.Start(t)
	c, err := sshx.Dial(ctx, sshx.Config{Host: srv.Host, Port: srv.Port, User: sshd.User, KeyPath: srv.ClientKeyPath,
		KnownHostsPath: filepath.Join(t.TempDir(), "known_hosts"), Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
