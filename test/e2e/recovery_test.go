package e2e_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// restartRecovery re-runs install on an installed host three times, each time with k3s failing
// to start on the configuration kip writes (the stand-in's fault file, docs/k3s-standin.md), and
// checks that each outcome is told apart: k3s back on the restored files; k3s down on the
// restored files too; the server lost before kip could restore them. Each time the operator had
// edited config.yaml, so kip rewrites it and keeps the edited one as config.yaml.kipper-bak.
func restartRecovery(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host) {
	t.Helper()
	run := hostRunner(ctx, t, h)
	const edit = "echo '# edited by the operator' >> /etc/rancher/k3s/config.yaml"
	fault := func(name string) string {
		return "mkdir -p /etc/k3s-standin && echo " + name + " > /etc/k3s-standin/fault"
	}
	config := "cat /etc/rancher/k3s/config.yaml /var/lib/rancher/k3s/server/kipper-audit-policy.yaml /etc/rancher/k3s/kipper-authentication.yaml"
	waitK3s := func() {
		t.Helper()
		run("for i in $(seq 120); do systemctl is-active -q k3s && exit 0; sleep 1; done; systemctl status k3s; exit 1")
	}

	// 1. k3s refuses the new files and comes back on the restored ones.
	run(edit)
	edited := run(config)
	run(fault("refuse-changed-config"))
	r := s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip restored the previous configuration and k3s runs on it again") {
		t.Fatalf("restart refused, rollback works: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := run(config); got != edited {
		t.Errorf("the files after the rollback are not the ones before the run:\n%s\nwant\n%s", got, edited)
	}
	if out := run("systemctl is-active k3s"); strings.TrimSpace(out) != "active" {
		t.Errorf("k3s after the rollback: %s", out)
	}
	run("rm /etc/k3s-standin/fault")

	// 2. k3s refuses every start: the rollback's restart fails too.
	run(edit)
	run(fault("refuse-every-start"))
	r = s.Kip(t, home, installArgs(s, h, s.Bundle)...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "and not on the restored previous one either") {
		t.Fatalf("every start refused: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	run("rm /etc/k3s-standin/fault")
	waitK3s() // systemd restarts it

	// 3. The server is lost while k3s starts on the new files: kip says it could not restore.
	run(edit)
	run(fault("hold-changed-config"))
	p := s.Start(t, home, installArgs(s, h, s.Bundle)...)
	held := h.Path("/var/lib/k3s-standin/held")
	for !p.Exited() {
		if _, err := os.Stat(held); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // kip waits on the held start: this is not a race
	}
	if p.Exited() {
		t.Fatalf("install ended before k3s's start was held:\n%s", p.Stderr())
	}
	if err := h.Partition(ctx, ""); err != nil {
		t.Fatal(err)
	}
	defer h.Heal(ctx, "") //nolint:errcheck // healed below; this only covers a failed test
	if err := os.Remove(held); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	r = p.Wait(t, 10*time.Minute)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip lost the server before it could restore the previous one") {
		t.Fatalf("server lost during the restart: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := h.Heal(ctx, ""); err != nil {
		t.Fatal(err)
	}
	waitK3s()
	// The same command continues once the server answers.
	if r = s.Kip(t, home, installArgs(s, h, s.Bundle)...); r.ExitCode != 0 {
		t.Fatalf("install after the server came back: exit %d\n%s", r.ExitCode, r.Stderr)
	}
}

// hostRunner returns a function that runs a command on h as root and returns its output,
// failing t when it fails.
func hostRunner(ctx context.Context, t *testing.T, h *lab.Host) func(cmd string) string {
	return func(cmd string) string {
		t.Helper()
		out, err := h.Run(ctx, cmd)
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return out
	}
}
