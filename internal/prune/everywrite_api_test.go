//go:build kipfault

package prune_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/service"
)

// The helper process: the test binary run again with these set prunes the copy of service db in
// a project against the parent's API server, as kip cluster storage prune db --project P --yes
// does. The server's commands run with sh on this machine, where a directory stands for the
// server's filesystem: the copies' directories are under it.
const (
	helperKubeconfig = "KIP_PRUNE_HELPER_KUBECONFIG"
	helperRoot       = "KIP_PRUNE_HELPER_ROOT"
	helperProject    = "KIP_PRUNE_HELPER_PROJECT"
)

func init() {
	asHelper = faulttest.AsHelper(helperKubeconfig, func(kubeconfig string) error {
		return helperPrune(kubeconfig, os.Getenv(helperRoot), os.Getenv(helperProject))
	})
}

func helperPrune(kubeconfig, root, project string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	// onServer runs a command kip runs on the server, with each path in it under root.
	onServer := func(ctx context.Context, cmd func(string) string, dir string) ([]byte, error) {
		out, err := exec.CommandContext(ctx, "sh", "-c", cmd(filepath.Join(root, dir))).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %s", cmd(dir), err, out)
		}
		return out, nil
	}
	ios := &cli.IOStreams{Out: os.Stdout, ErrOut: os.Stderr, Getenv: os.Getenv}
	o := prune.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, true),
		Holder: "kip cluster storage prune (helper)", KipVersion: "v0.0.0-test", Name: "db", Project: project,
		Remove: func(ctx context.Context, host, dir string) error {
			_, err := onServer(ctx, prune.RemoveCommand, dir)
			// Counted as sshx counts a command that changes a host: once it ended.
			fault.Remote(host, prune.RemoveCommand(dir))
			return err
		},
		Present: func(ctx context.Context, host, dir string) (bool, error) {
			out, err := onServer(ctx, prune.PresentCommand, dir)
			return strings.TrimSpace(string(out)) == "present", err
		},
		Clock: func() time.Time { return now }}
	return prune.Run(context.Background(), &o)
}

// pruneCase is one case of the kill test: in project P, service db whose copy may go and
// service cache whose copy is held back (its pod Ready for a minute), each copy's directory on
// the server (under root) holding files.
type pruneCase struct {
	project string
	// dirs are the copies' directories on the server, db's first; want what cache's holds.
	dirs [2]string
	want string
}

func (f *fixture) pruneCase(t *testing.T, root, project string) pruneCase {
	t.Helper()
	c := pruneCase{project: project}
	db, cache := healthy(project, "db"), healthy(project, "cache")
	cache.readyAt = now.Add(-time.Minute)
	for i, m := range []moved{db, cache} {
		f.service(t, m)
		pv, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(t.Context(), oldVolume(m.ref), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.dirs[i] = pv.Spec.HostPath.Path
		b := movertest.Builder{T: t, Root: filepath.Join(root, c.dirs[i])}
		b.Check(os.MkdirAll(filepath.Dir(b.Root), 0o755))
		b.Dir(".", 0o700, 999, 999)
		b.File("PG_VERSION", []byte("16\n"), 0o600, 999, 999)
		b.Dir("base", 0o700, 999, 999)
		b.File("base/1259", bytes.Repeat([]byte(m.ref.Name), 16<<10), 0o600, 999, 999)
	}
	c.want = movertest.Describe(t, filepath.Join(root, c.dirs[1]))
	return c
}

// endState describes, with the project written P, what a prune of db's copy leaves: both copies'
// volumes (there, being deleted or gone, and kip's annotations), what is on the server at each
// copy's directory and at the name the delete renames it to, whether cache's directory holds what
// it held, and whether a running process holds the cluster lock.
func (f *fixture) endState(ctx context.Context, t *testing.T, root string, c pruneCase) string {
	t.Helper()
	var out []string
	for i, name := range []string{"db", "cache"} {
		ref := service.Ref{Project: c.project, Environment: "prod", Name: name}
		pv, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, oldVolume(ref), metav1.GetOptions{})
		switch {
		case deleted(ctx, f, oldVolume(ref)) == nil:
			out = append(out, name+"'s copy: deleted")
		case err != nil:
			t.Fatal(err)
		default:
			var marks []string
			for k, v := range pv.Annotations {
				if strings.HasPrefix(k, "kipper.run/") {
					marks = append(marks, k+"="+v)
				}
			}
			sort.Strings(marks)
			out = append(out, name+"'s copy: kept, "+strings.Join(marks, ", "))
		}
		for _, dir := range []string{c.dirs[i], c.dirs[i] + ".kip-prune"} {
			if _, err := os.Lstat(filepath.Join(root, dir)); err == nil {
				out = append(out, "on the server: "+dir)
			}
		}
	}
	if got := movertest.Describe(t, filepath.Join(root, c.dirs[1])); got != c.want {
		out = append(out, "cache's directory changed:\n"+got)
	}
	lease, err := f.cl.Kube.CoordinationV1().Leases("kube-system").Get(ctx, kube.LockName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A run killed holding the lock leaves it to a process that no longer runs, which the next
	// kip command on this machine takes over at once: free, as far as an end state goes.
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" && !kube.HolderGone(*h) {
		out = append(out, "the cluster lock held by "+*h)
	}
	return strings.ReplaceAll(strings.Join(out, "\n"), c.project, "P")
}

// run runs the helper's prune of project's db with env added.
func (f *fixture) run(t *testing.T, root, project string, env ...string) faulttest.Result {
	t.Helper()
	return faulttest.Run(t, 2*time.Minute, append([]string{helperKubeconfig + "=" + f.e.KubeconfigPath, helperRoot + "=" + root,
		helperProject + "=" + project}, env...)...)
}

// TestPruneEveryWriteKilled prunes the copy of a service, killed after each single write of the
// prune in turn (a new case each time), then runs the prune again: every run again ends as the
// prune never interrupted did: the copy's volume deleted, its directory gone from the server and
// nothing left under the name the delete renames it to, the other copy of the project kept with
// its directory byte for byte, and the cluster lock held by no running process. A run again
// after the copy is gone says that no copy of the service is kept.
func TestPruneEveryWriteKilled(t *testing.T) {
	f := setup(t)
	f.record(t, cluster.BackupsNone)
	ctx := t.Context()
	root := t.TempDir()
	names := func(project string) map[string]string { return map[string]string{project: "P"} }

	c := f.pruneCase(t, root, "pw0")
	file := filepath.Join(t.TempDir(), "writes")
	if r := f.run(t, root, c.project, fault.WritesFileEnv+"="+file); r.Signal != 0 || r.Exit != 0 {
		t.Fatalf("the uninterrupted prune: signal %v, exit %d\n%s", r.Signal, r.Exit, r.Stderr)
	}
	reference := f.endState(ctx, t, root, c)
	var all []string
	for _, w := range faulttest.Writes(t, file) {
		all = append(all, faulttest.Anonymous(w, names(c.project)))
	}
	t.Logf("measured: the uninterrupted prune made %d writes; it ends as:\n%s\nits writes:\n%s", len(all), reference, strings.Join(all, "\n"))
	if !strings.HasPrefix(reference, "db's copy: deleted\ncache's copy: kept, ") || strings.Contains(reference, "on the server: "+strings.ReplaceAll(c.dirs[0], c.project, "P")) {
		t.Fatalf("the uninterrupted prune did not delete db's copy alone:\n%s", reference)
	}

	for i := 1; i <= len(all); i++ {
		c := f.pruneCase(t, root, fmt.Sprintf("pk%d", i))
		killed := faulttest.Killed(t, f.run(t, root, c.project, faulttest.KillAfter(i)), i)
		if got := faulttest.Anonymous(killed, names(c.project)); got != all[i-1] {
			t.Fatalf("write %d of this run is %q, of the uninterrupted run %q", i, got, all[i-1])
		}
		r := f.run(t, root, c.project)
		gone := "no local copy of service db in project " + c.project + " is kept"
		if r.Signal != 0 || (r.Exit != 0 && !strings.Contains(r.Stderr, gone)) {
			t.Errorf("the prune run again after a kill after write %d (%s): signal %v, exit %d\n%s", i, all[i-1], r.Signal, r.Exit, r.Stderr)
			continue
		}
		if got := f.endState(ctx, t, root, c); got != reference {
			t.Errorf("killed after write %d (%s), the run again ends as\n%s\nnot as the uninterrupted prune:\n%s\nits output:\n%s", i, all[i-1], got, reference, r.Stderr)
		}
	}
}
