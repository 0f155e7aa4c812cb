package lab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run runs a command on this machine; a failure carries the command and what it printed.
func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, name, args...)
	return err
}

// output runs a command on this machine and returns its standard output.
func output(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String() + " " + stdout.String())
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.String(), nil
}

// startDetached starts a process in a session of its own, with no standard input and its output
// appended to logPath, so that it outlives the process that started it; it writes its pid to
// pidPath. The process is reaped here if it ends while this process lives. It returns once the
// process's command line shows marker (see readPid).
func startDetached(name string, args, env []string, logPath, pidPath, marker string) (int, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer log.Close()
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	pid := cmd.Process.Pid
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		cmd.Process.Kill()
		return 0, err
	}
	// Start returns when the child's close-on-exec descriptors close, a moment before the
	// kernel gives /proc/PID/cmdline the new arguments.
	deadline := time.After(2 * time.Second)
	for !strings.Contains(cmdline(pid), marker) {
		select {
		case <-exited:
			return pid, nil
		case <-deadline:
			return pid, fmt.Errorf("%s (pid %d) does not show %q in its command line", name, pid, marker)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return pid, nil
}

// readPid returns the process recorded in pidPath if it is alive and its command line contains
// marker (a recorded pid may have been reused), else 0.
func readPid(pidPath, marker string) int {
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !alive(pid) || !strings.Contains(cmdline(pid), marker) {
		return 0
	}
	return pid
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) state ...": comm may contain spaces and parentheses.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// cmdline returns the command line of pid with its arguments separated by spaces.
func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

// children returns the children of pid.
func children(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// childNamed returns the child of pid whose command name is comm, or 0.
func childNamed(pid int, comm string) int {
	for _, c := range children(pid) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(c) + "/comm")
		if strings.TrimSpace(string(b)) == comm {
			return c
		}
	}
	return 0
}

// waitGone waits until pid has ended, or ctx ends.
func waitGone(ctx context.Context, pid int) error {
	for alive(pid) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// killWait sends SIGKILL to pid and waits up to 10 s for it to end.
func killWait(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitGone(ctx, pid); err != nil {
		return fmt.Errorf("process %d survived SIGKILL: %w", pid, err)
	}
	return nil
}
