package controlplane

import (
	"bufio"
	"errors"
	"fmt"
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

// Process is a child program running in its own process group.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // how it ended; valid after done
}

// Start starts cmd (its SysProcAttr replaced by SysProcAttr's) from the spawner thread, see
// below. onExit, when not nil, runs with cmd.Wait's result once the process has been reaped and
// before Done is closed.
func Start(name string, cmd *exec.Cmd, onExit func(error)) (*Process, error) {
	cmd.SysProcAttr = SysProcAttr()
	if err := startCmd(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if onExit != nil {
			onExit(p.err)
		}
		close(p.done)
	}()
	return p, nil
}

// spawner starts every child from one goroutine locked to its OS thread for the life of the
// program. On Linux the children get Pdeathsig=SIGKILL, which the kernel delivers when the
// *thread* that forked them exits: with a thread that never exits, they die exactly when the
// program dies (a panic, a test's -timeout, a SIGKILL), so no child outlives its parent.
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

// Pid is the process's id, which is also its process group's.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process ended (cmd.Wait's error); valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process's group, or to the process alone if the group cannot be
// signalled (for another reason than its being gone).
func (p *Process) Signal(sig syscall.Signal) {
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.Cmd.Process.Signal(sig)
	}
}

// Stop sends sig to the process group and waits up to timeout for the process to be reaped. If
// it was, Stop SIGKILLs whatever is left of its group (children it left behind) and returns true;
// otherwise it returns false and leaves the rest to the caller.
func (p *Process) Stop(sig syscall.Signal, timeout time.Duration) bool {
	p.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(timeout):
		return false
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	return true
}

// GroupAlive reports whether any process of the group led by pid still exists.
func GroupAlive(pid int) bool {
	err := syscall.Kill(-pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// TailFile returns the last n lines of the log file at path, or why there is none.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
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

// OwnerFile names, in a test's temporary directory, the pid of the test binary that made it.
const OwnerFile = "owner.pid"

// ReapStale removes the temporary directories named prefix* whose OwnerFile names a test binary
// that died without cleaning up (its child processes died with it).
func ReapStale(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, OwnerFile))
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

// Logged is a child program in its own process group (Start), its output appended to a log file.
type Logged struct {
	*Process
	LogPath string
}

// Spawn starts bin (an absolute path) with args in dir, its output appended to dir/name.log after
// a line with the command; env is added to a minimal environment (PATH, and HOME and TMPDIR set to
// dir).
func Spawn(dir, name, bin string, args, env []string) (*Logged, error) {
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
	p, err := Start(name, cmd, nil)
	if err != nil {
		return nil, err
	}
	return &Logged{Process: p, LogPath: logPath}, nil
}

// ExitError describes how the program ended, for errors raised while waiting for it.
func (p *Logged) ExitError() error {
	return fmt.Errorf("%s exited early (%v); see %s", p.Name, p.Err(), p.LogPath)
}

// Tail returns the last n lines of its log.
func (p *Logged) Tail(n int) string { return TailFile(p.LogPath, n) }

// LogContains reports whether its log holds sub.
func (p *Logged) LogContains(sub string) bool {
	data, err := os.ReadFile(p.LogPath)
	return err == nil && strings.Contains(string(data), sub)
}
