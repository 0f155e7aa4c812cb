// Package need lets a test demand an environment: when it is missing the test skips with the
// reason on a developer's machine and fails under CI (CI=true), where every environment must
// be present.
package need

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI (CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Missing skips t with the reason locally and fails it under CI.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("environment missing under CI=true: %s", reason)
	}
	t.Skipf("skipped: %s", reason)
}

// Root requires the test to run as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root (run make test as root)")
	}
}

// Command requires an executable on PATH or at an absolute path and returns its path.
func Command(t testing.TB, name, installHint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found (%s)", name, installHint)
	}
	return p
}

// Lab requires what test/lab needs to bring hosts up: root and the tools make test-deps
// installs.
func Lab(t testing.TB) {
	t.Helper()
	Root(t)
	for _, c := range []string{"systemd-nspawn", "debootstrap", "apt-cacher-ng", "zstd", "iptables", "ip", "tar"} {
		Command(t, c, "make test-deps installs it")
	}
}
