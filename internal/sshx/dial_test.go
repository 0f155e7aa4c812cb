package sshx

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kipper.run/kip/test/sshd"
)

// proxy forwards TCP connections to a target. It can drop the first connections at once, as
// sshd does beyond MaxStartups, and freeze the connections it carries, as a network that died
// silently would: it then drops what they send.
type proxy struct {
	l        net.Listener
	target   string
	dropLeft atomic.Int32
	mu       sync.Mutex
	frozen   []*atomic.Bool // one per connection carried
}

func startProxy(t *testing.T, target string, dropFirst int) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	p.dropLeft.Store(int32(dropFirst))
	t.Cleanup(func() { l.Close() })
	go p.serve()
	return p
}

func (p *proxy) port() int { return p.l.Addr().(*net.TCPAddr).Port }

func (p *proxy) serve() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		if p.dropLeft.Add(-1) >= 0 {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		frozen := &atomic.Bool{}
		p.mu.Lock()
		p.frozen = append(p.frozen, frozen)
		p.mu.Unlock()
		go pipe(out, in, frozen)
		go pipe(in, out, frozen)
	}
}

// freeze stops the connections carried so far; new connections still pass.
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.frozen {
		f.Store(true)
	}
}

func pipe(dst, src net.Conn, frozen *atomic.Bool) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if frozen.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// setTimings shortens keepalives and dial backoff for one test.
func setTimings(t *testing.T, keepalive time.Duration, backoff ...time.Duration) {
	oldKeepalive, oldBackoff := keepaliveInterval, dialBackoff
	keepaliveInterval, dialBackoff = keepalive, backoff
	t.Cleanup(func() { keepaliveInterval, dialBackoff = oldKeepalive, oldBackoff })
}

func TestDialGivesUpOnRefusedConnections(t *testing.T) {
	setTimings(t, keepaliveInterval, 10*time.Millisecond, 20*time.Millisecond, 40*time.Millisecond)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close() // nothing listens there now
	n := &notices{}
	_, err = Dial(context.Background(), Config{
		Host: "127.0.0.1", Port: port, KeyPath: writeKey(t, ""), SSHConfigPath: "/dev/null",
		KnownHostsPath: filepath.Join(t.TempDir(), "known_hosts"), Notify: n.notify,
	})
	prefix := fmt.Sprintf("ssh root@127.0.0.1:%d: ", port)
	if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), "connection refused") ||
		!strings.HasSuffix(err.Error(), "(gave up after 4 attempts)") {
		t.Fatalf("Dial = %v", err)
	}
	if got := n.count("retrying in"); got != 3 {
		t.Errorf("%d retry notices, want 3: %q", got, n.list())
	}
}

func TestDialRetriesDroppedHandshake(t *testing.T) {
	setTimings(t, keepaliveInterval, 10*time.Millisecond, 20*time.Millisecond, 40*time.Millisecond)
	srv := sshd.Start(t)
	p := startProxy(t, srv.Addr(), 2)
	cfg, n := testConfig(t, srv, sshd.User)
	cfg.Port = p.port()
	c := dial(t, cfg)
	mustRun(t, c, "true")
	if got := n.count("retrying in"); got != 2 {
		t.Errorf("%d retry notices, want 2: %q", got, n.list())
	}
}

func TestDialHonoursContext(t *testing.T) {
	// A listener that never answers: the handshake would wait for the dial timeout.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Dial(ctx, Config{
		Host: "127.0.0.1", Port: l.Addr().(*net.TCPAddr).Port, KeyPath: writeKey(t, ""), SSHConfigPath: "/dev/null",
		KnownHostsPath: filepath.Join(t.TempDir(), "known_hosts"), Timeout: time.Minute,
	})
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) || time.Since(start) > 3*time.Second {
		t.Fatalf("Dial = %v after %s, want the context's deadline", err, time.Since(start))
	}
}

func TestKeepaliveDetectsDeadConnection(t *testing.T) {
	setTimings(t, 100*time.Millisecond, 10*time.Millisecond)
	srv := sshd.Start(t)
	p := startProxy(t, srv.Addr(), 0)
	cfg, n := testConfig(t, srv, sshd.User)
	cfg.Port = p.port()
	c := dial(t, cfg)

	done := make(chan error, 1)
	go func() {
		_, err := c.Run(context.Background(), "sleep 3")
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	p.freeze()
	select {
	case err := <-done:
		want := fmt.Sprintf(`connection to %s lost while running "sleep 3": no reply from the server to 3 keepalives in 300ms; the command may or may not have completed`, c)
		if err == nil || err.Error() != want {
			t.Fatalf("Run = %v\nwant %s", err, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run still waits on a dead connection")
	}
	// The next command runs on a new connection.
	if got := mustRun(t, c, "echo again"); got != "again\n" {
		t.Errorf("after reconnecting: %q", got)
	}
	if n.count("Reconnecting") != 1 {
		t.Errorf("notices %q", n.list())
	}
}
