package host_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/host"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/need"
)

func TestPackageCommandsParse(t *testing.T) {
	for _, f := range []host.Family{host.Debian, host.RHEL} {
		for _, cmd := range []string{f.MissingPackagesCommand(f.LonghornPackages), f.InstallPackagesCommand([]string{"a b", "c'd"})} {
			if out, err := exec.Command("sh", "-n", "-c", cmd).CombinedOutput(); err != nil {
				t.Errorf("%s: sh -n: %v: %s\n%s", f.Name, err, out, cmd)
			}
		}
		if !strings.Contains(f.InstallPackagesCommand([]string{"a b"}), "'a b'") {
			t.Errorf("%s: package names are not quoted", f.Name)
		}
	}
}

// TestLonghornPackagesOnALabHost installs Longhorn's host packages on a real Debian host (apt
// through the lab's cache) and checks that the missing-packages command sees them before and
// not after.
func TestLonghornPackagesOnALabHost(t *testing.T) {
	need.Lab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, 1, lab.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Down(context.Background()) //nolint:errcheck // reported by the lab's own tests
	h := l.Hosts[0]
	pkgs := host.Debian.LonghornPackages

	out, err := h.Run(ctx, host.Debian.MissingPackagesCommand(pkgs))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(pkgs, " ") {
		t.Fatalf("missing before install: %q, want %q", got, pkgs)
	}
	if _, err := h.Run(ctx, host.Debian.InstallPackagesCommand(pkgs)); err != nil {
		t.Fatal(err)
	}
	if out, err := h.Run(ctx, host.Debian.MissingPackagesCommand(pkgs)); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("missing after install: %q, %v", out, err)
	}
}
