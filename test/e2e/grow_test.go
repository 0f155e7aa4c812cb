package e2e_test

import (
	"context"
	"strings"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// growSteps are kip cluster storage longhorn's steps that apply a change, in order. Its step
// longhorn-settings only checks: the Longhorn component's step applies the pinned settings, so
// it finds them in place and is never applied.
var growSteps = []string{"host-packages", "host-modules", "host-hardening", "component-longhorn", "cluster-record"}

// growOntoLonghorn grows the installed nano cluster on h onto Longhorn as the spec tells an
// operator to: refused at 4 GiB, naming the resize; the server resized to 8 GiB; kip cluster
// storage longhorn killed before each step and run again until it completes; Longhorn's host
// packages really installed by apt, its pinned settings and the one-copy class in place, the
// record's storage mode longhorn with the backup mode kept; a second run changes nothing.
func growOntoLonghorn(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	r := s.Kip(t, home, "cluster", "storage", "longhorn")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "MiB of RAM and Longhorn needs at least 6000 MiB: resize the server first") {
		t.Fatalf("kip cluster storage longhorn on 4 GiB: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := h.Resize(8192); err != nil {
		t.Fatal(err)
	}
	for _, step := range growSteps {
		point := "before:" + step
		r := s.KipEnv(t, home, []string{workflow.FaultEnv + "=" + point}, "cluster", "storage", "longhorn")
		if r.Signal != syscall.SIGKILL || !strings.Contains(r.Stderr, "kipfault: SIGKILL at "+point+" ") {
			t.Fatalf("kip cluster storage longhorn with %s=%s: exit %d (signal %v), want it killed there:\n%s", workflow.FaultEnv, point, r.ExitCode, r.Signal, r.Stderr)
		}
	}
	r = s.Kip(t, home, "cluster", "storage", "longhorn")
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is Longhorn") || !strings.Contains(r.Stderr, "No service keeps its data on local storage.") {
		t.Fatalf("kip cluster storage longhorn after the kills: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil || rec.Storage != cluster.StorageLonghorn || rec.Backups != cluster.BackupsNone || rec.Profile != "nano" {
		t.Fatalf("record after the switch: %+v, %v", rec, err)
	}
	if _, err := h.Run(ctx, sshx.Command("dpkg-query", "-W", "open-iscsi", "nfs-common")); err != nil {
		t.Errorf("Longhorn's host packages after the switch: %v", err)
	}
	if _, err := c.Kube.StorageV1().StorageClasses().Get(ctx, cluster.LonghornOneCopyClass, metav1.GetOptions{}); err != nil {
		t.Errorf("the one-copy class after the switch: %v", err)
	}
	if r := s.Kip(t, home, "cluster", "storage", "longhorn"); r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is already Longhorn") {
		t.Errorf("the switch run again: exit %d\n%s", r.ExitCode, r.Stderr)
	}
}
