package host_test

import (
	"os/exec"
	"strings"
	"testing"

	"kipper.run/kip/internal/host"
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
