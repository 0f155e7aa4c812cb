package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kipper.run/kip/test/controlplane"
)

// process is one control-plane program running in its own process group (see
// controlplane.Start), its output going to a log file in the environment's directory.
type process struct {
	*controlplane.Process
	logPath string
}

// spawn starts bin with args, output to dir/name.log. env is added to a minimal environment.
func spawn(dir, name, bin string, args []string, env []string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TMPDIR=" + dir}, env...)
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	p, err := controlplane.Start(name, cmd, nil)
	if err != nil {
		return nil, err
	}
	return &process{Process: p, logPath: logPath}, nil
}

// exitError describes how the process ended, for errors raised while waiting for it.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited early (%v); see %s", p.Name, p.Err(), p.logPath)
}

// kill sends SIGKILL to the process group and waits for the process to be reaped. The
// environment's data is thrown away, so there is nothing to shut down gracefully.
func (p *process) kill() error {
	if !p.Stop(syscall.SIGKILL, 30*time.Second) {
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid())
	}
	return nil
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logContains reports whether the process's log holds s.
func (p *process) logContains(s string) bool {
	data, err := os.ReadFile(p.logPath)
	return err == nil && strings.Contains(string(data), s)
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another program may take one before
// the control plane binds it; Start retries the whole start when a bind fails.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

const dirPrefix = "kip-testenv-"

// reapStale removes the directories of environments whose test binary died without cleaning up
// (its processes died with it, see spawner).
func reapStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}
