//go:build kipfault

package workflow

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// fault SIGKILLs the process when FaultEnv names this point: when:step, where step is s's Name
// or Title. It never returns then.
func fault(when string, s *Step) {
	point := os.Getenv(FaultEnv)
	if point == "" {
		return
	}
	kind, step, ok := strings.Cut(point, ":")
	if !ok || step == "" || (kind != "before" && kind != "after" && kind != "done") {
		panic(fmt.Sprintf("%s=%q: want before:<step>, after:<step> or done:<step>", FaultEnv, point))
	}
	if kind != when || (step != s.Name && step != s.Title) {
		return
	}
	fmt.Fprintf(os.Stderr, "kipfault: SIGKILL at %s (step %s)\n", point, s.Name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught: the process ends here
}
