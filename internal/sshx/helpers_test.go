package sshx

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kipper.run/kip/test/sshd"
)

// notices collects what a Client tells the operator.
type notices struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notices) notify(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.msgs = append(n.msgs, msg)
}

func (n *notices) list() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// count returns how many notices contain substr.
func (n *notices) count(substr string) int {
	c := 0
	for _, m := range n.list() {
		if strings.Contains(m, substr) {
			c++
		}
	}
	return c
}

// testConfig returns a Config that logs in to srv as user with the server's client key, with a
// known_hosts file of its own and no SSH client configuration.
func testConfig(t testing.TB, srv *sshd.Server, user string) (Config, *notices) {
	n := &notices{}
	return Config{
		Host:           srv.Host,
		Port:           srv.Port,
		User:           user,
		KeyPath:        srv.ClientKeyPath,
		KnownHostsPath: filepath.Join(t.TempDir(), "kip", "known_hosts"),
		Timeout:        5 * time.Second,
		Notify:         n.notify,
		SSHConfigPath:  "/dev/null",
	}, n
}

// dial connects with cfg and closes the Client when the test ends.
func dial(t testing.TB, cfg Config) *Client {
	t.Helper()
	c, err := Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startClient starts an sshd and returns a Client logged in to it as sshd.User.
func startClient(t testing.TB) (*Client, *sshd.Server, *notices) {
	srv := sshd.Start(t)
	cfg, n := testConfig(t, srv, sshd.User)
	return dial(t, cfg), srv, n
}

// mustRun runs cmd and fails the test unless it exits 0; it returns stdout.
func mustRun(t testing.TB, c *Client, cmd string) string {
	t.Helper()
	res, err := c.Run(context.Background(), cmd)
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Stdout)
}

// eventually polls cond every 20 ms until it holds or timeout passes.
func eventually(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
