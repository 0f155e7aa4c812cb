package node

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		{127, "timeout: failed to run command 'bash': No such file or directory\n", false, "exit status 127: timeout: failed to run command 'bash'"},
		{126, "timeout: failed to run command 'bash': Permission denied\n", false, "exit status 126"},
		{125, "timeout: invalid time interval\n", false, "exit status 125"},
		{1, "bash: /dev/tcp/192.0.2.31/10250: Invalid argument\n", false, "exit status 1: bash: /dev/tcp/192.0.2.31/10250: Invalid argument"},
	} {
		got, err := connected(sshx.Result{ExitStatus: c.status, Stderr: []byte(c.stderr)}, "root@server:22", target)
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
	srv := sshd.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := sshx.Dial(ctx, sshx.Config{Host: srv.Host, Port: srv.Port, User: sshd.User, KeyPath: srv.ClientKeyPath,
		KnownHostsPath: filepath.Join(t.TempDir(), "known_hosts"), Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
}
