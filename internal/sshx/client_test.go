package sshx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"kipper.run/kip/internal/stop"
	"kipper.run/kip/test/sshd"
)

func TestKeyAuthAndSudo(t *testing.T) {
	c, _, _ := startClient(t)
	if got := mustRun(t, c, "id -u"); got != "0\n" {
		t.Errorf("id -u = %q, want 0: commands run as root through sudo", got)
	}
	if got := mustRun(t, c, "echo $SUDO_USER"); got != sshd.User+"\n" {
		t.Errorf("SUDO_USER = %q, want %s", got, sshd.User)
	}
	if got := c.String(); !strings.HasPrefix(got, sshd.User+"@127.0.0.1:") {
		t.Errorf("String() = %q", got)
	}
	if got := c.Host(); got != "127.0.0.1" {
		t.Errorf("Host() = %q, want 127.0.0.1", got)
	}
}

// TestRootRunsWithoutSudo covers kip's default user. Root's shell on the build machines spends
// about 0.5 s in ~/.bashrc per command, so this test runs few.
func TestRootRunsWithoutSudo(t *testing.T) {
	srv := sshd.Start(t)
	cfg, _ := testConfig(t, srv, "root")
	c := dial(t, cfg)
	if got := mustRun(t, c, "echo $(id -u) ${SUDO_USER:-no-sudo}"); got != "0 no-sudo\n" {
		t.Errorf("id -u, SUDO_USER = %q, want 0 and no sudo", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Run(ctx, "sleep 30.31"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want a timeout", err)
	}
	if !eventually(5*time.Second, func() bool { return !remoteRunning(t, c, "sleep 30.31") }) {
		t.Fatal("the remote sleep is still running")
	}
}

func TestNoSudo(t *testing.T) {
	srv := sshd.Start(t)
	cfg, _ := testConfig(t, srv, sshd.NoSudoUser)
	_, err := Dial(context.Background(), cfg)
	want := "user kipnosudo on 127.0.0.1 cannot run sudo without a password: allow it (e.g. 'kipnosudo ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/kipnosudo) or use --ssh-user root"
	if err == nil || err.Error() != want {
		t.Fatalf("Dial as %s: %v\nwant: %s", sshd.NoSudoUser, err, want)
	}
}

func TestRunResult(t *testing.T) {
	c, _, _ := startClient(t)
	res, err := c.Run(context.Background(), "echo out; echo first >&2; echo 'it broke' >&2; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "out\n" || string(res.Stderr) != "first\nit broke\n" || res.ExitStatus != 3 {
		t.Errorf("Result = %q, %q, %d", res.Stdout, res.Stderr, res.ExitStatus)
	}
	want := fmt.Sprintf(`ssh %s: command "echo out; echo first >&2; echo 'it broke' >&2; exit 3" exited 3: it broke`, c)
	if err := res.Err(); err == nil || err.Error() != want {
		t.Errorf("Err() = %v, want %s", err, want)
	}
}

func TestRunInput(t *testing.T) {
	c, _, _ := startClient(t)
	in := "line 1\n'quoted' \"and\" $(not run)\n\x00\xff binary\n"
	res, err := c.RunInput(context.Background(), "cat", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != in {
		t.Errorf("cat echoed %q, want %q", res.Stdout, in)
	}
	// Without input, a command reading stdin sees its end at once.
	if got := mustRun(t, c, "wc -c"); strings.TrimSpace(got) != "0" {
		t.Errorf("wc -c without input = %q", got)
	}
}

// remoteRunning reports whether a process whose command line matches pattern runs on the host,
// asking over c. The pattern's first letter is bracketed so that it does not match the shells
// running pgrep.
func remoteRunning(t *testing.T, c *Client, pattern string) bool {
	t.Helper()
	res, err := c.Run(context.Background(), Command("pgrep", "-f", "["+pattern[:1]+"]"+pattern[1:]))
	if err != nil {
		t.Fatal(err)
	}
	return res.ExitStatus == 0
}

func TestRunTimeoutKillsCommand(t *testing.T) {
	c, _, _ := startClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Run(ctx, "sleep 30.17; echo done")
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("Run returned after %s, want about 1s", elapsed)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `command "sleep 30.17; echo done" timed out and was stopped`) {
		t.Fatalf("Run = %v, want a timeout", err)
	}
	// The remote sleep is gone too; ask over a second connection.
	other := dial(t, c.cfg)
	if !eventually(3*time.Second, func() bool { return !remoteRunning(t, other, "sleep 30.17") }) {
		t.Fatal("the remote sleep is still running")
	}
}

func TestRunCancelKillsCommand(t *testing.T) {
	c, _, _ := startClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := c.Run(ctx, "sleep 30.23")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `command "sleep 30.23" was cancelled and stopped: context canceled`) {
		t.Fatalf("Run = %v, want a cancellation", err)
	}
	if !eventually(3*time.Second, func() bool { return !remoteRunning(t, c, "sleep 30.23") }) {
		t.Fatal("the remote sleep is still running")
	}
	mustRun(t, c, "true") // the connection is still good
}

// TestConcurrentTimeouts stops more commands at once than sshd allows sessions: each stop
// needs a session of its own while the stopped ones still count.
func TestConcurrentTimeouts(t *testing.T) {
	c, _, _ := startClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errs := make([]error, 12)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			// The commands that never got one of the 8 session slots did not start.
			_, err := c.Run(ctx, "sleep 30.47")
			if !errors.Is(err, context.DeadlineExceeded) ||
				!strings.HasSuffix(err.Error(), `"sleep 30.47" timed out and was stopped: context deadline exceeded`) &&
					!strings.HasSuffix(err.Error(), `"sleep 30.47" not started: context deadline exceeded`) {
				errs[i] = fmt.Errorf("Run = %v", err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if !eventually(3*time.Second, func() bool { return !remoteRunning(t, c, "sleep 30.47") }) {
		t.Fatal("some remote sleeps are still running")
	}
}

func TestStopRequestRefusesToStart(t *testing.T) {
	c, _, _ := startClient(t)
	marker := "/tmp/kip-sshx-stop-" + fmt.Sprint(time.Now().UnixNano())
	ctx, request := stop.WithRequest(context.Background())
	mustRun(t, c, "true")
	request()
	_, err := c.Run(ctx, Command("touch", marker))
	if want := fmt.Sprintf("ssh %s: command %q not started: %v", c, Command("touch", marker), stop.ErrInterrupted); !errors.Is(err, stop.ErrInterrupted) || err.Error() != want {
		t.Fatalf("Run after a stop request = %v, want %s", err, want)
	}
	if remoteExists := mustRun(t, c, "test -e "+Quote(marker)+" && echo yes || echo no"); remoteExists != "no\n" {
		t.Fatal("the command ran after the stop request")
	}
}

func TestSequentialCommandsShareOneConnection(t *testing.T) {
	c, srv, _ := startClient(t)
	for i := range 200 {
		if got := mustRun(t, c, Command("echo", fmt.Sprint(i))); got != fmt.Sprintf("%d\n", i) {
			t.Fatalf("command %d printed %q", i, got)
		}
	}
	if n := srv.Connections(); n != 1 {
		t.Errorf("sshd serves %d connections, want 1", n)
	}
}

func TestConcurrentSessions(t *testing.T) {
	c, srv, _ := startClient(t)
	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Go(func() {
			res, err := c.Run(context.Background(), fmt.Sprintf("sleep 0.1; echo %d", i))
			if err == nil {
				err = res.Err()
			}
			if err == nil && string(res.Stdout) != fmt.Sprintf("%d\n", i) {
				err = fmt.Errorf("printed %q", res.Stdout)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := srv.Connections(); n != 1 {
		t.Errorf("sshd serves %d connections, want 1", n)
	}
}

func TestDroppedConnection(t *testing.T) {
	c, srv, n := startClient(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(context.Background(), "sleep 5")
		done <- err
	}()
	time.Sleep(time.Second)
	srv.KillConnections()
	select {
	case err := <-done:
		want := fmt.Sprintf(`connection to %s lost while running "sleep 5": `, c)
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "; the command may or may not have completed") {
			t.Fatalf("Run = %v, want %q...", err, want)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Run did not return after the connection dropped")
	}
	if got := mustRun(t, c, "echo again"); got != "again\n" {
		t.Errorf("after reconnecting: %q", got)
	}
	if n.count("Reconnecting to "+c.String()) != 1 {
		t.Errorf("notices %q, want one about reconnecting", n.list())
	}
}
