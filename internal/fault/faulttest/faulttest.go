// Package faulttest is what the kill-after-every-write tests share (package fault): the test
// binary run again as a helper process that does one workflow (its TestMain does the work when
// the helper's environment asks for it), how that process ended, and the writes it logged.
package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/kube"
)

// Result is how a helper process ended.
type Result struct {
	Stderr string
	// Signal is the signal that ended it, 0 when it exited; Exit is its exit status, -1 when a
	// signal ended it.
	Signal syscall.Signal
	Exit   int
}

// Process is a helper process started.
type Process struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stderr bytes.Buffer
}

// Start runs the test binary again with no test to run (-test.run=^$) and env added to this
// process's environment; it is killed after timeout.
func Start(t testing.TB, timeout time.Duration, env ...string) *Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	p := &Process{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^$"), cancel: cancel}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start the helper process: %v", err)
	}
	return p
}

// Wait waits for the process to end.
func (p *Process) Wait(t testing.TB) Result {
	t.Helper()
	defer p.cancel()
	err := p.cmd.Wait()
	r := Result{Stderr: p.stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.Exit = exit.ExitCode()
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.Signal = ws.Signal()
		}
	default:
		t.Fatalf("run the helper process: %v\n%s", err, r.Stderr)
	}
	return r
}

// Run is Start and Wait.
func Run(t testing.TB, timeout time.Duration, env ...string) Result {
	t.Helper()
	return Start(t, timeout, env...).Wait(t)
}

// AsHelper is what a test binary of the kill-after-every-write tests runs before its tests: when
// env names a kubeconfig, the binary is the helper process a test started, and it runs fn with
// that kubeconfig and exits (1 after printing fn's error).
func AsHelper(env string, fn func(kubeconfig string) error) func() {
	return func() {
		kubeconfig := os.Getenv(env)
		if kubeconfig == "" {
			return
		}
		if err := fn(kubeconfig); err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// Clients are a helper process's clients for the parent's API server, from its kubeconfig:
// built as kip builds them, so that each mutating request counts as a write.
func Clients(kubeconfig string) (*kube.Clients, error) {
	cfg, err := kube.LoadConfig(kubeconfig, "")
	if err != nil {
		return nil, err
	}
	return kube.NewClients(cfg)
}

// Writes reads a fault.WritesFileEnv file: what each write was, in order.
func Writes(t testing.TB, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var what []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		n, w, ok := strings.Cut(line, "\t")
		if !ok || n != fmt.Sprint(len(what)+1) {
			t.Fatalf("%s: line %q out of order", file, line)
		}
		what = append(what, w)
	}
	return what
}

// KillAfter is the environment that has the helper killed after its write n.
func KillAfter(n int) string { return fmt.Sprintf("%s=%d", fault.KillWriteEnv, n) }

// KillAfterMatching is the environment that has the helper killed after its first write whose
// description matches the regular expression pattern.
func KillAfterMatching(pattern string) string {
	return fault.KillWriteMatchingEnv + "=" + pattern
}

// killed is the number and description of the write after which r was killed, n < 1 when r
// was not killed after a write.
func killed(r Result) (n int, what string) {
	if r.Signal != syscall.SIGKILL {
		return 0, ""
	}
	return KilledAfter(r.Stderr)
}

// KilledAfter reads, from what a kipfault build wrote to stderr, the number and description of
// the write it killed itself after; n < 1 when it did not.
func KilledAfter(stderr string) (n int, what string) {
	_, rest, found := strings.Cut(stderr, "kipfault: SIGKILL after write ")
	if !found {
		return 0, ""
	}
	rest, _, _ = strings.Cut(rest, "\n")
	num, what, _ := strings.Cut(rest, ": ")
	if n, err := strconv.Atoi(num); err == nil {
		return n, what
	}
	return 0, ""
}

// Killed checks that r ended killed right after its write n, and returns what that write was.
func Killed(t testing.TB, r Result, n int) string {
	t.Helper()
	got, what := killed(r)
	if got != n {
		t.Fatalf("the run killed after write %d: signal %v, exit %d\n%s", n, r.Signal, r.Exit, r.Stderr)
	}
	return what
}

// MaxKilledRuns bounds KillEveryWrite: a command that writes something new at every run never
// ends.
const MaxKilledRuns = 200

// KillEveryWrite runs run again and again, run giving the command fault.KillNewWriteEnv naming
// one file for all the runs, so that each run is killed right after the first write no run
// before it made, until a run ends by itself; it returns what each killed run wrote last, in
// order. run returns the signal that ended the command (0 when it exited) and its stderr;
// killed, when not nil, is called after each kill with that write, for the test to look at the
// state it left. A run ended otherwise fails the test, as does a command still writing
// something new after MaxKilledRuns runs.
func KillEveryWrite(t testing.TB, what string, run func() (syscall.Signal, string), killed func(write string)) []string {
	t.Helper()
	var writes []string
	for range MaxKilledRuns {
		sig, stderr := run()
		if sig == 0 {
			t.Logf("%s: killed after each of its %d writes, resumed each time, and done", what, len(writes))
			return writes
		}
		n, write := KilledAfter(stderr)
		if sig != syscall.SIGKILL || n < 1 {
			t.Fatalf("%s, run %d: ended by %v, not killed after a write\n%s", what, len(writes)+1, sig, stderr)
		}
		writes = append(writes, write)
		if killed != nil {
			killed(write)
		}
	}
	t.Fatalf("%s was still writing after %d runs, each killed after a new write:\n%s", what, MaxKilledRuns, strings.Join(writes, "\n"))
	return nil
}

// KilledMatching checks that r ended killed right after a write that matches pattern, and
// returns what that write was.
func KilledMatching(t testing.TB, r Result, pattern string) string {
	t.Helper()
	n, what := killed(r)
	if n < 1 || !regexp.MustCompile(pattern).MatchString(what) {
		t.Fatalf("the run killed after a write matching %q: signal %v, exit %d\n%s", pattern, r.Signal, r.Exit, r.Stderr)
	}
	return what
}

var (
	// uid is a Kubernetes UID, as in the name of a volume a provisioner made.
	uid = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	// lockWrite takes or releases the cluster lock: a create of its Lease the first time, an
	// update once an earlier run left it.
	lockWrite = regexp.MustCompile(`^API (POST|PUT) /apis/coordination.k8s.io/v1/namespaces/kube-system/leases(/kip-lock)?$`)
)

// Anonymous is a write's description with each key of names written as its value, UIDs written
// UID and the cluster lock's Lease written or created alike: the same for the same write of a
// workflow on any object.
func Anonymous(what string, names map[string]string) string {
	what = lockWrite.ReplaceAllString(what, "API write the cluster lock's Lease")
	for name, as := range names {
		what = strings.ReplaceAll(what, name, as)
	}
	return uid.ReplaceAllString(what, "UID")
}
