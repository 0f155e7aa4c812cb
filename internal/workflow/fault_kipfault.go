//go:build kipfault

package workflow

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// faultPoint acts at a fault point: when:step, where step is s's Name or Title. It SIGKILLs the
// process when FaultEnv names the point, and never returns then. It pauses when PauseEnv names
// it: it creates the file PauseFileEnv names and returns once that file is gone.
func faultPoint(when string, s *Step) {
	if at(FaultEnv, when, s) {
		fmt.Fprintf(os.Stderr, "kipfault: SIGKILL at %s (step %s)\n", os.Getenv(FaultEnv), s.Name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught: the process ends here
	}
	if at(PauseEnv, when, s) {
		pause(os.Getenv(PauseFileEnv), s)
	}
}

// at reports whether the fault point in the environment variable env is when:step for s.
func at(env, when string, s *Step) bool {
	point := os.Getenv(env)
	if point == "" {
		return false
	}
	kind, step, ok := strings.Cut(point, ":")
	if !ok || step == "" || (kind != "before" && kind != "after" && kind != "done") {
		panic(fmt.Sprintf("%s=%q: want before:<step>, after:<step> or done:<step>", env, point))
	}
	return kind == when && (step == s.Name || step == s.Title)
}

// pause creates file, holding this process's pid, and waits until it is removed: the test that
// set the point changes what it wants while nothing runs, then lets the run go on. The wait has
// no deadline, so the machine's speed decides nothing.
func pause(file string, s *Step) {
	if file == "" {
		panic(fmt.Sprintf("%s is set but %s is not: name the file the pause creates", PauseEnv, PauseFileEnv))
	}
	if err := os.WriteFile(file, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		panic(fmt.Sprintf("kipfault: create the pause file: %v", err))
	}
	fmt.Fprintf(os.Stderr, "kipfault: paused at %s (step %s) until %s is removed\n", os.Getenv(PauseEnv), s.Name, file)
	for {
		if _, err := os.Stat(file); os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
