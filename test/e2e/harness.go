// Package e2e runs the real kip binary against lab hosts (test/lab): it builds bin/kip-fault (kip
// with the runner's fault points, make build-fault) and the k3s stand-in, brings a lab up once
// per test package, runs kip as a subprocess with its own KIP_HOME, and gives tests what they
// need to look at hosts and the cluster and to break things while a command runs (kill a host,
// cut its network, or have kip kill itself at a step boundary: Suite.StartEnv with
// workflow.FaultEnv).
//
// A package of end-to-end tests starts with
//
//	func TestMain(m *testing.M) { os.Exit(e2e.Main(m, 3, lab.Options{})) }
//
// and each test calls e2e.Get(t) for the shared Suite.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/need"
	"kipper.run/kip/test/testenv"
	velerotest "kipper.run/kip/test/velero"
)

// StandinBinDir is where lab hosts find the test control plane's binaries, which the k3s
// stand-in runs (bind-mounted read-only from bin/testenv).
const StandinBinDir = "/opt/kip-testenv"

// StandinImagesDir is where k3s imports an airgap install's images from.
const StandinImagesDir = "/var/lib/rancher/k3s/agent/images"

// VeleroDir is where lab hosts find Velero's build (sh tools/testenv.sh velero; bind-mounted
// read-only from bin/velero): Velero's container images under images/, which the backup tests
// import on the hosts that run Velero (ImportVeleroImages).
const VeleroDir = "/opt/kip-velero"

// PostgresDir is where lab hosts find the lab's PostgreSQL image (sh tools/testenv.sh postgres;
// bind-mounted read-only from bin/postgres): images/postgres.tar, which tests import on the hosts
// that run a Postgres pod (ImportPostgresImage).
const PostgresDir = "/opt/kip-postgres"

// PostgresImage is the reference of the lab's PostgreSQL image: the official image's, holding
// Debian's PostgreSQL 15 with a stand-in entrypoint (test/images -set postgres).
const PostgresImage = "docker.io/library/postgres:15"

// Suite is what a package's end-to-end tests share.
type Suite struct {
	Lab *lab.Lab
	// KipBin is the kip binary under test, built from this checkout with -tags kipfault (make
	// build-fault): without workflow.FaultEnv in its environment it behaves as bin/kip does.
	KipBin string
	// Bundle is an airgap bundle directory laid out like a k3s release's assets (k3s and
	// sha256sum-amd64.txt) holding the k3s stand-in, for kip's airgap path.
	Bundle string
	// OlderBundle is the same for the stand-in claiming OlderK3s, which runs that release's real
	// control plane, kubelet and kube-proxy; "" when make testenv-older has not built them.
	OlderBundle string
}

// OlderK3s is the older k3s release the upgrade tests start from: the stand-in claiming it runs
// Kubernetes 1.36's binaries (tools/testenv/go.older.mod, make testenv-older).
const OlderK3s = "v1.36.3+k3s1"

// MissingOlder reports that the older release's binaries are not built (skipped locally, failed
// under CI=true).
func MissingOlder(t testing.TB) {
	t.Helper()
	need.Missing(t, "the older Kubernetes release the k3s upgrade starts from is not built: run make testenv-older")
}

var (
	suite    *Suite
	setupErr error     // why there is no suite: every test reports it
	started  time.Time // when Main started: the timings' rows count from it
)

// Main builds kip and the k3s stand-in, brings up a lab of n hosts, runs the package's tests and
// removes the lab. Without root, the lab's tools or the test control-plane binaries, the tests
// report why (skipped locally, failed under CI=true).
func Main(m *testing.M, n int, opts lab.Options) int {
	started = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s, err := setUp(ctx, n, opts)
	if err != nil {
		setupErr = err
		return m.Run()
	}
	Timing(fmt.Sprintf("builds and a lab of %d hosts", n), started, "")
	suite = s
	code := m.Run()
	os.RemoveAll(s.Bundle) //nolint:errcheck // a temporary directory
	if s.OlderBundle != "" {
		os.RemoveAll(s.OlderBundle) //nolint:errcheck // a temporary directory
	}
	downCtx, downCancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer downCancel()
	if err := s.Lab.Down(downCtx); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: remove the lab: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func setUp(ctx context.Context, n int, opts lab.Options) (*Suite, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("end-to-end tests need root (run make test as root)")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	bins, err := testenv.BinDir()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bins, "kube-apiserver")); err != nil {
		return nil, fmt.Errorf("test control-plane binaries not built: run make testenv (%v)", err)
	}
	s := &Suite{KipBin: filepath.Join(root, "bin", "kip-fault")}
	for _, target := range []string{"build-fault", "k3s-standin"} {
		cmd := exec.CommandContext(ctx, "make", "-C", root, target)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("make %s: %v\n%s", target, err, out)
		}
	}
	if s.Bundle, err = StandinBundle(filepath.Join(root, "bin", "k3s-standin")); err != nil {
		return nil, err
	}
	release, _, _ := strings.Cut(OlderK3s, "+")
	if _, err := os.Stat(filepath.Join(bins, release)); err == nil {
		cmd := exec.CommandContext(ctx, "make", "-C", root, "k3s-standin-older")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("make k3s-standin-older: %v\n%s", err, out)
		}
		if s.OlderBundle, err = StandinBundle(filepath.Join(root, "bin", "k3s-standin-"+release)); err != nil {
			return nil, err
		}
	}
	binds, err := StandinBinds(bins)
	if err != nil {
		return nil, err
	}
	opts.ReadOnly = append(opts.ReadOnly, binds...)
	veleroDir, err := velerotest.BinDir()
	if err != nil {
		return nil, err
	}
	if veleroDir, err = filepath.EvalSymlinks(veleroDir); err != nil {
		return nil, fmt.Errorf("velero's test binaries are not built: run make testenv (%v)", err)
	}
	opts.ReadOnly = append(opts.ReadOnly, lab.Bind{Source: veleroDir, Target: VeleroDir})
	postgresDir, err := PostgresBinDir()
	if err != nil {
		return nil, err
	}
	if postgresDir, err = filepath.EvalSymlinks(postgresDir); err != nil {
		return nil, fmt.Errorf("the lab's PostgreSQL image is not built: run make testenv (sh tools/testenv.sh postgres) (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(postgresDir, "images", "postgres.tar")); err != nil {
		return nil, fmt.Errorf("the lab's PostgreSQL image is not built: run make testenv (sh tools/testenv.sh postgres) (%v)", err)
	}
	opts.ReadOnly = append(opts.ReadOnly, lab.Bind{Source: postgresDir, Target: PostgresDir})
	if s.Lab, err = lab.Up(ctx, n, opts); err != nil {
		return nil, fmt.Errorf("bring up a lab of %d hosts: %w", n, err)
	}
	return s, nil
}

// PostgresBinDir is the build of the lab's PostgreSQL image: $KIP_POSTGRES_BIN, else the
// checkout's bin/postgres (sh tools/testenv.sh postgres).
func PostgresBinDir() (string, error) {
	if d := os.Getenv("KIP_POSTGRES_BIN"); d != "" {
		return d, nil
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "postgres"), nil
}

// StandinBinds bind the test environment's binaries (bins, usually bin/testenv) into lab hosts
// at StandinBinDir, where the k3s stand-in finds them, and its container images where a k3s
// airgap install has them (StandinImagesDir), which the stand-in imports when it starts.
func StandinBinds(bins string) ([]lab.Bind, error) {
	resolved, err := filepath.EvalSymlinks(bins)
	if err != nil {
		return nil, err
	}
	images := filepath.Join(resolved, "images")
	if _, err := os.Stat(filepath.Join(images, ".stamp")); err != nil {
		return nil, fmt.Errorf("the lab's container images are not built: run make testenv (%v)", err)
	}
	return []lab.Bind{{Source: resolved, Target: StandinBinDir}, {Source: images, Target: StandinImagesDir}}, nil
}

// StandinBundle lays the stand-in out as an x86_64 k3s release's airgap assets in a new
// temporary directory, with the checksum file that make k3s-standin wrote beside it.
func StandinBundle(bin string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	sums, err := os.ReadFile(bin + ".sha256")
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "kip-e2e-bundle-")
	if err != nil {
		return "", err
	}
	sums = bytes.Replace(sums, []byte(filepath.Base(bin)), []byte("k3s"), 1)
	if err := os.WriteFile(filepath.Join(dir, "k3s"), data, 0o755); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "sha256sum-amd64.txt"), sums, 0o644)
}

// Get returns the package's Suite, or reports why there is none.
func Get(t testing.TB) *Suite {
	t.Helper()
	if suite == nil {
		if setupErr == nil {
			setupErr = errors.New("e2e.Main was not called from TestMain")
		}
		need.Missing(t, "%v", setupErr)
	}
	start := time.Now()
	t.Cleanup(func() {
		note := ""
		if t.Failed() {
			note = "FAILED"
		}
		Timing(t.Name(), start, note)
	})
	return suite
}

// Run is t.Run with the subtest's time in the run's table (Timing).
func Run(t *testing.T, name string, fn func(t *testing.T)) bool {
	t.Helper()
	start := time.Now()
	ok := t.Run(name, fn)
	note := ""
	if !ok {
		note = "FAILED"
	}
	Timing(t.Name()+"/"+name, start, note)
	return ok
}

var timingsMu sync.Mutex

// Timing adds a row to the run's table of where the time went (tools/timings.sh; the file
// KIP_TIMINGS names, when it does): what took the time since start, and when it began and ended,
// counted from the package's start. The package's own row follows its tests' rows; a test adds
// rows for its long parts.
func Timing(what string, start time.Time, note string) {
	file := os.Getenv("KIP_TIMINGS")
	if file == "" {
		return
	}
	clock := func(d time.Duration) string {
		s := int(d.Round(time.Second).Seconds())
		return fmt.Sprintf("%d:%02d", s/60, s%60)
	}
	now := time.Now()
	row := fmt.Sprintf("        %s\t%d\t%s to %s of test/e2e %s\n", what, now.Sub(start).Milliseconds(), clock(start.Sub(started)), clock(now.Sub(started)), note)
	timingsMu.Lock()
	defer timingsMu.Unlock()
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return // no table to add to: the run did not start one
	}
	defer f.Close()
	f.WriteString(row) //nolint:errcheck // the table is a report; the tests decide the outcome
}

// Own returns the lab hosts of the indexes given, which t alone uses, and cuts their power when
// t has ended, after t's other cleanups (registered later, they run first): a finished test's
// cluster then takes no CPU from the tests still running beside it. A power cut, not a shutdown:
// nothing of the host is looked at afterwards, and a shutdown waits on whatever the host's
// services and mounts do at their end, for as long as the machine's load makes it. The lab
// removes them at the end as it removes every host.
func (s *Suite) Own(t testing.TB, indexes ...int) []*lab.Host {
	t.Helper()
	hosts := make([]*lab.Host, len(indexes))
	for i, n := range indexes {
		hosts[i] = s.Lab.Hosts[n]
	}
	t.Cleanup(func() {
		for _, h := range hosts {
			if !h.Running() {
				continue // the test stopped or killed it
			}
			if err := h.Kill(); err != nil {
				t.Errorf("cut the power of %s at the end of the test: %v", h.Name, err)
			}
		}
	})
	return hosts
}

// Home returns a fresh KIP_HOME for one test.
func (s *Suite) Home(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Result is how a kip run ended.
type Result struct {
	Stdout, Stderr string
	// ExitCode is kip's exit status, -1 when a signal ended it.
	ExitCode int
	// Signal is the signal that ended kip, 0 when it exited.
	Signal syscall.Signal
}

// LastLine is the last non-empty line kip wrote to stderr (its error, when it failed): a
// failure message puts it first, where a long output cut in the middle still shows it.
func (r Result) LastLine() string {
	lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
	return lines[len(lines)-1]
}

// Process is a kip command running in the background, so that a test can break a host (Kill,
// Partition, Stop on its lab.Host) or kip itself while the command runs, then Wait for it.
type Process struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr syncBuffer
	done   chan struct{}
	err    error
}

// Start runs kip with args in the background, with KIP_HOME=home, no terminal and no colour.
func (s *Suite) Start(t testing.TB, home string, args ...string) *Process {
	t.Helper()
	return s.StartEnv(t, home, nil, args...)
}

// StartEnv is Start with env (KEY=value) added to kip's environment for this run, e.g.
// workflow.FaultEnv+"=before:Start k3s".
func (s *Suite) StartEnv(t testing.TB, home string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{done: make(chan struct{})}
	p.cmd = exec.Command(s.KipBin, args...)
	p.cmd.Env = append(append(os.Environ(), "KIP_HOME="+home, "NO_COLOR=1", "TERM=dumb"), env...)
	p.cmd.Stdin = nil
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start kip: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // best effort
			<-p.done
		}
	})
	t.Log(strings.Join(append(append(env[:len(env):len(env)], "kip"), args...), " "))
	return p
}

// Kip runs kip with args to completion.
func (s *Suite) Kip(t testing.TB, home string, args ...string) Result {
	t.Helper()
	return s.Start(t, home, args...).Wait(t, 30*time.Minute)
}

// KipEnv runs kip with args to completion, with env added to its environment (see StartEnv).
func (s *Suite) KipEnv(t testing.TB, home string, env []string, args ...string) Result {
	t.Helper()
	return s.StartEnv(t, home, env, args...).Wait(t, 30*time.Minute)
}

// Stderr returns what kip has written to stderr so far.
func (p *Process) Stderr() string { return p.stderr.String() }

// Exited reports whether kip has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill kills kip outright, as a lost laptop would.
func (p *Process) Kill() error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

// Paused starts kip with env and args, paused (workflow.PauseEnv) at point, and returns once kip
// waits there; the test removes the returned file to let it go on, then Waits for it.
func (s *Suite) Paused(t testing.TB, home string, env []string, point string, args ...string) (*Process, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "paused")
	p := s.StartEnv(t, home, append(env[:len(env):len(env)], workflow.PauseEnv+"="+point, workflow.PauseFileEnv+"="+file), args...)
	deadline := time.After(30 * time.Minute)
	for {
		if _, err := os.Stat(file); err == nil {
			return p, file
		}
		select {
		case <-p.done:
			t.Fatalf("kip ended before it paused at %s:\n%s", point, p.stderr.String())
		case <-deadline:
			t.Fatalf("kip did not pause at %s within 30 minutes:\n%s", point, p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KillEveryWrite runs kip with env and args again and again, each run killed right after the
// first write no run before it made (fault.KillNewWriteEnv), until a run ends by itself, and
// returns that run and what each killed run wrote last, in order: the state after each write of
// the command is left by a kill and resumed by the next run. killed, when not nil, is called
// after each kill with that write and the killed run, for the test to look at the state it left
// and at what the run said.
func (s *Suite) KillEveryWrite(t testing.TB, home string, env []string, killed func(write string, r Result), args ...string) (Result, []string) {
	t.Helper()
	env = append(env[:len(env):len(env)], fault.KillNewWriteEnv+"="+filepath.Join(t.TempDir(), "made"))
	var last Result
	writes := faulttest.KillEveryWrite(t, "kip "+strings.Join(args, " "), func() (syscall.Signal, string) {
		last = s.KipEnv(t, home, env, args...)
		return last.Signal, last.Stderr
	}, func(write string) {
		if killed != nil {
			killed(write, last)
		}
	})
	return last, writes
}

// Wait waits for kip to end and returns its output and exit code.
func (p *Process) Wait(t testing.TB, timeout time.Duration) Result {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill() //nolint:errcheck // reported below
		<-p.done
		t.Fatalf("kip did not finish within %s:\n%s", timeout, p.stderr.String())
	}
	r := Result{Stdout: p.stdout.String(), Stderr: p.stderr.String()}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
	case errors.As(p.err, &exit):
		r.ExitCode = exit.ExitCode()
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.Signal = ws.Signal()
		}
	default:
		t.Fatalf("kip: %v", p.err)
	}
	if r.Signal != 0 {
		t.Logf("kip ended by %v\n%s", r.Signal, r.Stderr)
	} else {
		t.Logf("kip exited %d\n%s", r.ExitCode, r.Stderr)
	}
	return r
}

// syncBuffer is a buffer written by a process while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
