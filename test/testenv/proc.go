package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one control-plane program running in its own process group, its output going to a
// log file in the environment's directory.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited and been reaped
	waitErr error         // valid after done
}

// spawner starts every child from one goroutine locked to its OS thread for the life of the test
// binary. The children get Pdeathsig=SIGKILL, which Linux delivers when the *thread* that forked
// them exits: with a thread that never exits, they die exactly when the test binary dies (a
// panic, a -timeout, a SIGKILL), so no control plane outlives its tests.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func startCmd(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: see spawner
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawner.reqs <- r
	return <-r.done
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
	cmd.SysProcAttr = sysProcAttr()
	fmt.Fprintf(logFile, "# %s %s\n", bin, strings.Join(args, " "))
	if err := startCmd(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes how the process ended, for errors raised while waiting for it.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited early (%v); see %s", p.name, p.waitErr, p.logPath)
}

// kill sends SIGKILL to the process group and waits for the process to be reaped. The
// environment's data is thrown away, so there is nothing to shut down gracefully.
func (p *process) kill() error {
	if !p.exited() {
		pid := p.cmd.Process.Pid
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			_ = p.cmd.Process.Kill()
		}
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
	// The group may hold children of the process; none of the control-plane programs fork, but
	// make sure.
	if err := syscall.Kill(-p.cmd.Process.Pid, 0); err == nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	return nil
}

// groupAlive reports whether any process of the group led by pid still exists.
func groupAlive(pid int) bool {
	err := syscall.Kill(-pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
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
