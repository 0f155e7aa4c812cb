package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// growArgs is kip cluster storage longhorn.
var growArgs = []string{"cluster", "storage", "longhorn"}

// growFiles are the host files the switch writes: the kernel modules loaded at boot, journald's
// and multipathd's hardening (docs/host.md).
var growFiles = []string{"/etc/modules-load.d/kipper.conf", "/etc/systemd/journald.conf.d/90-kipper.conf", "/etc/multipath/conf.d/kipper.conf"}

// growPackages are Longhorn's host packages on Debian.
var growPackages = []string{"open-iscsi", "nfs-common"}

// growOntoLonghorn grows the installed nano cluster on h onto Longhorn as the spec tells an
// operator to: refused at 4 GiB, naming the resize; the server resized to 8 GiB; kip cluster
// storage longhorn run once uninterrupted, its writes logged (apt over SSH, the kernel modules,
// the hardening files, the Longhorn component, its settings and classes, the record, the
// progress record and the lock). Then, for each of those writes in turn, the cluster and host
// are put back as they were before the switch (ungrow, checked against the state before), the
// switch is killed right after that write (checked to be the same write as in the uninterrupted
// run) and run again: each run again must leave what the uninterrupted run left (growState:
// the record, the files byte for byte, the packages installed, Longhorn's settings and classes,
// no unfinished workflow, no running kip holding the lock; checkGrown checks the uninterrupted
// run's against the spec), and a further run finds the storage already Longhorn.
func growOntoLonghorn(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	r := s.Kip(t, home, growArgs...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "MiB of RAM and Longhorn needs at least 6000 MiB: resize the server first") {
		t.Fatalf("kip cluster storage longhorn on 4 GiB: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if err := h.Resize(8192); err != nil {
		t.Fatal(err)
	}
	before, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	files := hostFiles(ctx, t, h)
	fresh := growState(ctx, t, h, c)

	// The uninterrupted switch, its writes logged.
	file := filepath.Join(t.TempDir(), "writes")
	r = s.KipEnv(t, home, []string{fault.WritesFileEnv + "=" + file}, growArgs...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is Longhorn") || !strings.Contains(r.Stderr, "No service keeps its data on local storage.") {
		t.Fatalf("kip cluster storage longhorn: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	grown := growState(ctx, t, h, c)
	checkGrown(ctx, t, s, home, h, c, before)
	var all []string
	for _, w := range faulttest.Writes(t, file) {
		all = append(all, faulttest.Anonymous(w, nil))
	}
	// The writes each part of the switch must make, so that a log that lost some fails here (the
	// log cuts long commands short: the host preparation's, modules and hardening, read alike).
	for _, want := range []string{"apt-get", "# Host preparation", "/helmcharts/longhorn", "/settings/", "/storageclasses/" + cluster.LonghornOneCopyClass,
		"/configmaps/" + kube.RecordsConfigMap, "API write the cluster lock's Lease"} {
		if !slices.ContainsFunc(all, func(w string) bool { return strings.Contains(w, want) }) {
			t.Fatalf("the uninterrupted switch's %d writes have none with %q:\n%s", len(all), want, strings.Join(all, "\n"))
		}
	}
	t.Logf("measured: the uninterrupted switch made %d writes", len(all))

	start := time.Now()
	for n := 1; n <= len(all); n++ {
		if !e2e.Run(t, fmt.Sprintf("killed after write %d, %.80s", n, all[n-1]), func(t *testing.T) {
			ungrow(ctx, t, h, c, before, files, fresh)
			r := s.KipEnv(t, home, []string{faulttest.KillAfter(n)}, growArgs...)
			if what := faulttest.Killed(t, faulttest.Result{Stderr: r.Stderr, Signal: r.Signal, Exit: r.ExitCode}, n); faulttest.Anonymous(what, nil) != all[n-1] {
				t.Fatalf("write %d of this switch is %q, of the uninterrupted one %q", n, what, all[n-1])
			}
			// Killed once the switch's progress record says finished, a run again finds the
			// storage already Longhorn.
			if r := s.Kip(t, home, growArgs...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is ") {
				t.Fatalf("the switch run again: exit %d\n%s", r.ExitCode, r.Stderr)
			}
			if got := growState(ctx, t, h, c); got != grown {
				t.Fatalf("after the switch killed after write %d and run again:\n%s\nafter the uninterrupted one:\n%s", n, got, grown)
			}
			if r := s.Kip(t, home, growArgs...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is already Longhorn") {
				t.Fatalf("the switch run once more: exit %d\n%s", r.ExitCode, r.Stderr)
			}
		}) {
			break
		}
	}
	t.Logf("measured: %d switches killed after one write and run again in %s", len(all), time.Since(start).Round(time.Second))
}

// checkGrown checks the switch's end state against what the spec asks: the record's storage
// longhorn with the profile, backup mode and other versions kept and Longhorn's version added,
// Longhorn's packages installed, its pinned settings and the one-copy class in place, and a
// further run finding the storage already Longhorn.
func checkGrown(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients, before cluster.Record) {
	t.Helper()
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	want := maps.Clone(before.Versions)
	want["longhorn"] = rec.Versions["longhorn"]
	if err != nil || rec.Storage != cluster.StorageLonghorn || rec.Backups != before.Backups || rec.Profile != before.Profile ||
		rec.Versions["longhorn"] == "" || !maps.Equal(rec.Versions, want) {
		t.Errorf("record after the switch: %+v, %v; before it: %+v", rec, err, before)
	}
	if out, err := h.Run(ctx, sshx.Command("dpkg-query", append([]string{"-W", "-f", "${db:Status-Status}\n"}, growPackages...)...)); err != nil || out != "installed\ninstalled\n" {
		t.Errorf("Longhorn's host packages after the switch: %q, %v", out, err)
	}
	if pending, err := components.PinnedSettingsPending(ctx, c); pending != "" || err != nil {
		t.Errorf("Longhorn's pinned settings after the switch: %s, %v", pending, err)
	}
	if sc, err := c.Kube.StorageV1().StorageClasses().Get(ctx, cluster.LonghornOneCopyClass, metav1.GetOptions{}); err != nil || sc.Parameters["nodeSelector"] != longhorn.ServerTag {
		t.Errorf("the one-copy class after the switch: %v %v", sc, err)
	}
	if n, err := c.Longhorn.LonghornV1beta2().Nodes(longhornNamespace).Get(ctx, h.Name, metav1.GetOptions{}); err != nil || !slices.Contains(n.Spec.Tags, longhorn.ServerTag) {
		t.Errorf("the server's Longhorn node after the switch is not tagged %s: %v", longhorn.ServerTag, err)
	}
	if r := s.Kip(t, home, growArgs...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "The cluster's storage is already Longhorn") {
		t.Errorf("the switch run again: exit %d\n%s", r.ExitCode, r.Stderr)
	}
}

// hostFiles reads growFiles on h: their contents by path, those missing left out.
func hostFiles(ctx context.Context, t *testing.T, h *lab.Host) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range growFiles {
		exists, err := h.Run(ctx, "test -e "+sshx.Quote(f)+" && echo yes || echo no")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(exists) == "no" {
			continue
		}
		if out[f], err = h.Run(ctx, "cat "+sshx.Quote(f)); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// growState describes what kip cluster storage longhorn changes, to compare two runs' end
// states: the cluster record, the host files it writes (byte for byte, with their modes and
// owners), Longhorn's host packages, Longhorn's settings, the server's Longhorn tags and the
// classes, the unfinished workflows
// and whether a running kip holds the cluster lock.
func growState(ctx context.Context, t *testing.T, h *lab.Host, c *kube.Clients) string {
	t.Helper()
	var b strings.Builder
	rec, _, err := cluster.ReadRecord(ctx, c.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "record: profile %s, storage %s, backups %q, network %s, versions %v, monitoring %+v, max copies %d\n",
		rec.Profile, rec.Storage, rec.Backups, rec.Network, rec.Versions, rec.Monitoring, rec.MaxCopies)
	files := hostFiles(ctx, t, h)
	for _, f := range growFiles {
		if data, ok := files[f]; ok {
			fmt.Fprintf(&b, "file %s:\n%s\n", f, data)
		} else {
			fmt.Fprintf(&b, "file %s: none\n", f)
		}
	}
	out, err := h.Run(ctx, "stat -c '%n %a %U:%G' "+sshx.QuoteAll(growFiles)+" 2>/dev/null; dpkg-query -W -f '${Package} ${db:Status-Status}\\n' "+sshx.QuoteAll(growPackages)+" 2>&1 || true")
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(out)
	settings, err := c.Longhorn.LonghornV1beta2().Settings(longhornNamespace).List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		for _, st := range settings.Items {
			fmt.Fprintf(&b, "setting %s: %s\n", st.Name, st.Value)
		}
	case !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
		t.Fatal(err)
	}
	n, err := c.Longhorn.LonghornV1beta2().Nodes(longhornNamespace).Get(ctx, h.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		fmt.Fprintf(&b, "Longhorn node %s: tags %v\n", h.Name, n.Spec.Tags)
	case !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
		t.Fatal(err)
	}
	for _, name := range []string{"longhorn", cluster.LonghornOneCopyClass} {
		sc, err := c.Kube.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(&b, "class %s: none\n", name)
		case err != nil:
			t.Fatal(err)
		default:
			fmt.Fprintf(&b, "class %s: %s %v, default %q\n", name, sc.Provisioner, sc.Parameters, sc.Annotations["storageclass.kubernetes.io/is-default-class"])
		}
	}
	unfinished, err := workflow.ListUnfinished(ctx, c.Dynamic, kube.ClusterRecords())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range unfinished {
		names = append(names, p.Workflow+" at "+p.Step)
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "unfinished workflows: %v\n", names)
	lease, err := c.Kube.CoordinationV1().Leases("kube-system").Get(ctx, kube.LockName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Killed after it wrote its finished progress record, a run leaves the lock to a process
	// that no longer runs, which the next run that needs the lock takes over at once.
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != "" && !kube.HolderGone(holder) {
		fmt.Fprintf(&b, "lock held by %q\n", holder)
	} else {
		b.WriteString("lock free or held by a kip that no longer runs\n")
	}
	return b.String()
}

// longhornNamespace is where Longhorn runs.
const longhornNamespace = "longhorn-system"

// ungrow puts the cluster and host back as they were before the switch (fresh is growState
// then, files hostFiles then, before the record then): Longhorn's packages purged, the host
// files as they were, the Longhorn HelmChart deleted and its Job gone (the next one applies the
// chart's fixtures again, as helm would install the chart), Longhorn's settings and the two
// classes deleted, the record as it was. Longhorn's namespace and CRDs stay, as after a failed
// chart install; the finished progress record of the switch stays too.
func ungrow(ctx context.Context, t *testing.T, h *lab.Host, c *kube.Clients, before cluster.Record, files map[string]string, fresh string) {
	t.Helper()
	if out, err := h.Run(ctx, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "+sshx.QuoteAll(growPackages)); err != nil {
		t.Fatalf("purge Longhorn's packages: %v\n%s", err, out)
	}
	up := map[string]e2e.File{}
	for _, f := range growFiles {
		if data, ok := files[f]; ok {
			up[f] = e2e.File{Data: []byte(data), Mode: 0o644}
		} else if out, err := h.Run(ctx, "rm -f "+sshx.Quote(f)); err != nil {
			t.Fatalf("remove %s: %v\n%s", f, err, out)
		}
	}
	if err := e2e.Upload(ctx, h, up); err != nil {
		t.Fatal(err)
	}
	charts := c.Dynamic.Resource(schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}).Namespace("kube-system")
	if err := charts.Delete(ctx, "longhorn", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, "the Longhorn chart's Job to go", func(ctx context.Context) (bool, error) {
		_, err := c.Kube.BatchV1().Jobs("kube-system").Get(ctx, "helm-install-longhorn", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Longhorn.LonghornV1beta2().Settings(longhornNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	// The server's Longhorn node (the chart's fixture makes it again, untagged).
	if err := c.Longhorn.LonghornV1beta2().Nodes(longhornNamespace).Delete(ctx, h.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		t.Fatal(err)
	}
	for _, name := range []string{"longhorn", cluster.LonghornOneCopyClass} {
		if err := c.Kube.StorageV1().StorageClasses().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	if _, err := cluster.UpdateRecord(ctx, c.Dynamic, func(r *cluster.Record, _ bool) error { *r = before; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := growState(ctx, t, h, c); got != fresh {
		t.Fatalf("put back as before the switch:\n%s\nbefore the switch:\n%s", got, fresh)
	}
}
