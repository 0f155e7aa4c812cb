package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"kipper.run/kip/test/controlplane"
)

// supervisor runs the stand-in's programs (etcd, kube-*, kwok) as children. The stand-in lives
// exactly as long as all of them: when one ends on its own, failed is closed and the stand-in
// stops the rest and exits non-zero, so systemd's Restart= acts as it would for k3s.
type supervisor struct {
	mu       sync.Mutex
	children []*controlplane.Process
	stopping bool

	failOnce sync.Once
	failed   chan struct{}
	failure  error
}

func newSupervisor() *supervisor {
	return &supervisor{failed: make(chan struct{})}
}

// start runs path with args, reading stdin (nil for none). Its output goes to the stand-in's
// stderr, each line prefixed with name. The child is in its own process group, so a terminal's
// Ctrl-C reaches only the stand-in, which then stops it in order; and it gets SIGKILL if the
// stand-in dies: k3s's unit has KillMode=process, so systemd would leave it running otherwise.
// (See controlplane.Start.)
func (s *supervisor) start(name, path string, args, env []string, stdin io.Reader) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return fmt.Errorf("start %s: stopping", name)
	}
	out := &prefixWriter{prefix: name}
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdin = stdin
	cmd.Stdout, cmd.Stderr = out, out
	c, err := controlplane.Start(name, cmd, func(err error) {
		out.flush()
		s.mu.Lock()
		stopping := s.stopping
		s.mu.Unlock()
		if !stopping {
			s.fail(fmt.Errorf("%s exited: %v", name, exitDescription(err)))
		}
	})
	if err != nil {
		return err
	}
	slog.Info("started "+name, "pid", c.Pid())
	s.children = append(s.children, c)
	return nil
}

func (s *supervisor) fail(err error) {
	s.failOnce.Do(func() {
		s.failure = err
		close(s.failed)
	})
}

func exitDescription(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// stopTimeout is how long a child may take to stop before it is killed. kube-apiserver can wait
// far longer for watches that agents hold open; k3s, which runs it in-process, just exits.
const stopTimeout = 5 * time.Second

// stop ends the children in the reverse of their start order: SIGTERM to each process group,
// SIGKILL after timeout.
func (s *supervisor) stop(timeout time.Duration) {
	s.mu.Lock()
	s.stopping = true
	children := append([]*controlplane.Process(nil), s.children...)
	s.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		if !c.Stop(syscall.SIGTERM, timeout) {
			slog.Info(c.Name+" did not stop in time; killing it", "timeout", timeout)
			c.Signal(syscall.SIGKILL)
			<-c.Done()
			c.Signal(syscall.SIGKILL) // anything left in its group
		}
		slog.Info("stopped " + c.Name)
	}
}

// childEnv is the stand-in's environment for its children, without NOTIFY_SOCKET (etcd would
// answer systemd itself) and with extra added.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// prefixWriter copies a child's output to stderr line by line, each line prefixed with the
// child's name. exec.Cmd calls Write from one goroutine at a time.
type prefixWriter struct {
	prefix string
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(os.Stderr, "%s: %s\n", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *prefixWriter) flush() {
	if len(w.buf) > 0 {
		fmt.Fprintf(os.Stderr, "%s: %s\n", w.prefix, w.buf)
		w.buf = nil
	}
}

// sdNotify sends state to systemd when it started the stand-in as a Type=notify service (the
// sd_notify protocol: one datagram to $NOTIFY_SOCKET; a leading @ names an abstract socket, which
// Go's net package maps).
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}
