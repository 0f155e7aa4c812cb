package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
	"kipper.run/kip/test/longhorn-standin/standin"
)

// The service move tests' hosts (indexes in Lab.Hosts): the moves and kills, and the rollbacks.
const (
	moveHost       = 9  // lab10
	rollbackHost   = 12 // lab13
	backupMoveHost = 18 // lab19
	writesHost     = 20 // lab21
)

// moveSteps are the steps of a Postgres service's move, in order: the tests kill kip before each.
var moveSteps = []string{"fence", "stop", "retain", "volume", "copy", "detach", "verify", "commit", "claim", "release", "dump", "class", "start"}

// rollbackKills are the steps TestMoveRolledBack kills the move before: each up to the commit,
// and the first after it, where the rollback is refused.
var rollbackKills = moveSteps[:slices.Index(moveSteps, "commit")+2]

// moveLab is one cluster that carries every service of the move test.
type moveLab struct {
	s          *e2e.Suite
	h          *lab.Host
	c          *kube.Clients
	cfg        *rest.Config
	kubeconfig string
	home       string
}

// setUpMoveLab runs the k3s stand-in's server on h with what kip install applies that a move
// relies on (Kipper's CRDs, kipper-base with its admission policies, the one-copy Longhorn class,
// the cluster record of a cluster grown onto Longhorn without backups), the Longhorn stand-in
// and the console stand-in turning Kipper's objects into workloads. The data mover's image is
// not imported: the host's containerd gets it from kip's first move there.
func setUpMoveLab(ctx context.Context, t testing.TB, host int, configure ...func(*consolestandin.Standin)) *moveLab {
	t.Helper()
	s := e2e.Get(t)
	h := s.Own(t, host)[0]
	e2e.LogK3sOnFailure(t, h)
	if err := s.InstallStandin(ctx, h, "server", e2e.ServerConfig(h)); err != nil {
		t.Fatal(err)
	}
	kubeconfig, cfg, c := s.Clients(ctx, t, h, h.Name)
	standin.LogOnFailure(t, h)
	if err := standin.Install(ctx, h, c); err != nil {
		t.Fatal(err)
	}
	// The host's Longhorn data path is on this machine's shared disk, whose 25% free this test
	// cannot promise (see TestLonghornStandin).
	setSetting(ctx, t, c, "storage-minimal-available-percentage", "0")
	pinned, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	nano, err := cluster.ProfileNamed("nano")
	if err != nil {
		t.Fatal(err)
	}
	comps, err := components.Render(components.Options{Sizing: cluster.Sizing{Profile: nano, Storage: cluster.StorageLonghorn},
		ServerAddress: h.PublicIP.String(), Pinned: pinned, KipVersion: buildinfo.Version})
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, comp := range comps {
		switch comp.Name {
		case "kipper-crds", "kipper-base":
			objs = append(objs, comp.Objects...)
		case "longhorn":
			for _, o := range comp.After {
				if o.GetKind() == "StorageClass" && o.GetName() == cluster.LonghornOneCopyClass {
					objs = append(objs, o)
				}
			}
		}
	}
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	// As install does: the class of one-copy volumes selects the server's Longhorn tag.
	if err := longhorn.PlacementStep(c).Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.UpdateRecord(ctx, c.Dynamic, func(rec *cluster.Record, found bool) error {
		rec.Profile, rec.Storage, rec.Network, rec.Server = "nano", cluster.StorageLonghorn, cluster.NetworkWireGuard, h.PublicIP.String()
		rec.KipVersion, rec.Backups = buildinfo.Version, cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	console := &consolestandin.Standin{Kube: c.Kube, Dynamic: c.Dynamic, Image: busyboxImage,
		Command:  []string{"sh", "-c", `trap "exit 0" TERM; while :; do sleep 1; done`},
		Interval: 5 * time.Second, Logf: t.Logf}
	for _, c := range configure {
		c(console)
	}
	go func() { defer close(done); console.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	return &moveLab{s: s, h: h, c: c, cfg: cfg, kubeconfig: kubeconfig, home: s.Home(t)}
}

// busyboxImage is the lab's busybox, which the services of the test run.
const busyboxImage = "docker.io/rancher/mirrored-library-busybox:1.37.0"

// project creates a project with one environment and waits for its namespace.
func (l *moveLab) project(ctx context.Context, t testing.TB, name, env string) {
	t.Helper()
	createProject(ctx, t, l.c, name, env)
}

// createProject creates a project with one environment in c's cluster and waits for its
// namespace, which the console (its stand-in) makes.
func createProject(ctx context.Context, t testing.TB, c *kube.Clients, name, env string) {
	t.Helper()
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"environments": []any{map[string]any{"name": env}}}}}
	if _, err := c.Dynamic.Resource(service.ProjectsGVR).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "namespace "+name+"-"+env, func(ctx context.Context) (bool, string, error) {
		_, err := c.Kube.CoreV1().Namespaces().Get(ctx, name+"-"+env, metav1.GetOptions{})
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// service creates a Postgres-like service on local storage, waits until it runs, fills its data
// directory from outside with fill, and returns the directory as this machine sees it.
func (l *moveLab) service(ctx context.Context, t testing.TB, ref service.Ref, storage string, fill func(dir string)) string {
	t.Helper()
	return l.serviceOfType(ctx, t, ref, "postgres", storage, fill)
}

// serviceOfType is service for a service of type typ.
func (l *moveLab) serviceOfType(ctx context.Context, t testing.TB, ref service.Ref, typ, storage string, fill func(dir string)) string {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace()},
		"spec": map[string]any{"type": typ, "storage": storage,
			"resources": map[string]any{"cpuRequest": "50m", "memoryRequest": "32Mi"}}}}
	if _, err := l.c.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := service.WaitRunning(ctx, l.c.Dynamic, l.c.Kube, ref, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	dir := l.h.Path(claimDirIn(ctx, t, l.c, ref.Namespace(), "data-"+ref.Name+"-0"))
	fill(dir)
	return dir
}

// kip runs kip against the lab's cluster with env added.
func (l *moveLab) kip(t testing.TB, env []string, args ...string) e2e.Result {
	t.Helper()
	return l.s.KipEnv(t, l.home, env, l.args(args)...)
}

// args are kip's arguments for the lab's cluster: its kubeconfig, and the host's SSH key for the
// commands that reach the server (a move puts the mover's image there, prune deletes copies).
func (l *moveLab) args(args []string) []string {
	return append([]string{"--kubeconfig", l.kubeconfig, "--ssh-key", l.h.KeyPath, "--yes"}, args...)
}

// tamperCopy adds a file to the move's Longhorn volume from outside, as a pod that got past the
// fence would: the volume is detached, and its image is mounted here on a loop device the test
// owns.
func (l *moveLab) tamperCopy(ctx context.Context, t *testing.T, ref service.Ref) {
	t.Helper()
	pvc, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "kip-move-"+ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitVolumeDetached(ctx, t, l.c, pvc.Spec.VolumeName)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", standin.Image(l.h, pvc.Spec.VolumeName), dir).CombinedOutput(); err != nil {
		t.Fatalf("mount the move's Longhorn volume: %v\n%s", err, out)
	}
	// The file alone differs: the root keeps its times.
	var root unix.Stat_t
	if err := unix.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	werr := os.WriteFile(filepath.Join(dir, "tampered"), []byte("not the original's\n"), 0o644)
	if werr == nil {
		werr = unix.UtimesNano(dir, []unix.Timespec{root.Atim, root.Mtim})
	}
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	if werr != nil {
		t.Fatal(werr)
	}
}

func moveArgs(ref service.Ref, extra ...string) []string {
	return append([]string{"service", "storage", "longhorn", ref.Name, "--project", ref.Project, "--environment", ref.Environment, "--no-backup"}, extra...)
}

// movedData is what the service's data claim holds now, described from outside: the service is
// stopped (and left so), Longhorn has detached the volume, and its image is mounted read-only here
// on a loop device the test owns.
func (l *moveLab) movedData(ctx context.Context, t testing.TB, ref service.Ref) string {
	t.Helper()
	pvc, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "data-"+ref.Name+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := l.c.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != "driver.longhorn.io" {
		t.Fatalf("claim %s/%s is bound to %s (%s), not a Longhorn volume", ref.Namespace(), pvc.Name, pv.Name, service.Where(pv))
	}
	if r := l.kip(t, nil, "service", "stop", ref.Name, "--project", ref.Project, "--environment", ref.Environment); r.ExitCode != 0 {
		t.Fatalf("kip service stop: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	waitVolumeDetached(ctx, t, l.c, pv.Spec.CSI.VolumeHandle)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-o", "ro,loop,noload", standin.Image(l.h, pv.Spec.CSI.VolumeHandle), dir).CombinedOutput(); err != nil {
		t.Fatalf("mount the Longhorn volume's image: %v\n%s", err, out)
	}
	desc := movertest.Describe(t, dir, "lost+found")
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	return desc
}

// waitVolumeDetached waits until Longhorn reports volume detached.
func waitVolumeDetached(ctx context.Context, t testing.TB, c *kube.Clients, volume string) {
	t.Helper()
	if err := kube.Poll(ctx, 3*time.Minute, "Longhorn volume "+volume+" to detach", func(ctx context.Context) (bool, string, error) {
		v, err := c.Longhorn.LonghornV1beta2().Volumes(standin.Namespace).Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return v.Status.State == longhornv1beta2.VolumeStateDetached, "state " + string(v.Status.State), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// checkOnLonghorn checks that a moved service runs with its claim on Longhorn, that its old local
// volume is kept with its data as it was, that the move left no pod, fence or record, and, the
// service stopped, that the Longhorn volume holds the original's data.
func (l *moveLab) checkOnLonghorn(ctx context.Context, t testing.TB, ref service.Ref, oldDir, want string) {
	t.Helper()
	if got := movertest.Describe(t, oldDir); got != want {
		t.Errorf("%s: the local copy changed:\n--- before\n%s\n--- after\n%s", ref, want, got)
	}
	if err := service.WaitRunning(ctx, l.c.Dynamic, l.c.Kube, ref, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	svc, err := service.Get(ctx, l.c.Dynamic, ref)
	if err != nil || svc.Move != "" || svc.StorageClass != cluster.LonghornOneCopyClass {
		t.Errorf("%s after the move: %+v, %v", ref, svc, err)
	}
	pods, err := l.c.Kube.CoreV1().Pods(ref.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: move.MoveLabel})
	if err != nil || len(pods.Items) > 0 {
		t.Errorf("%s: the move left pods: %v %v", ref, pods, err)
	}
	ns, err := l.c.Kube.CoreV1().Namespaces().Get(ctx, ref.Namespace(), metav1.GetOptions{})
	if _, fenced := ns.Labels[moveguard.NamespaceLabel(ref.Name)]; err != nil || fenced {
		t.Errorf("%s: namespace still fenced: %v %v", ref, ns.Labels, err)
	}
	unfinished, err := workflow.ListUnfinished(ctx, l.c.Dynamic, kube.ClusterRecords())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unfinished {
		if strings.HasSuffix(p.Workflow, "-"+ref.Name) {
			t.Errorf("%s: unfinished record %s at %s", ref, p.Workflow, p.Step)
		}
	}
	if got := l.movedData(ctx, t, ref); got != want {
		t.Errorf("%s: the Longhorn volume differs from the original:\n--- original\n%s\n--- on Longhorn\n%s", ref, want, got)
	}
}

// checkOnLocal checks that a rolled-back service runs on its original local volume, byte for
// byte as it was, with nothing of the move left.
func (l *moveLab) checkOnLocal(ctx context.Context, t *testing.T, ref service.Ref, oldDir, want string) {
	t.Helper()
	if err := service.WaitRunning(ctx, l.c.Dynamic, l.c.Kube, ref, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	pvc, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "data-"+ref.Name+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := l.c.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.HostPath == nil && pv.Spec.Local == nil {
		t.Errorf("%s after rollback: claim bound to %s", ref, service.Where(pv))
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Annotations[move.ReclaimAnnotation] != "" {
		t.Errorf("%s after rollback: volume %s policy %s, annotations %v", ref, pv.Name, pv.Spec.PersistentVolumeReclaimPolicy, pv.Annotations)
	}
	if got := movertest.Describe(t, oldDir); got != want {
		t.Errorf("%s: the local data changed:\n--- before\n%s\n--- after\n%s", ref, want, got)
	}
	if _, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "kip-move-"+ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("%s after rollback: the move's claim: %v", ref, err)
	}
}

// killedBefore creates service ref with a small tree and runs its move until kip kills itself
// before step; it returns the service's data directory and its description.
func (l *moveLab) killedBefore(ctx context.Context, t *testing.T, ref service.Ref, step string) (string, string) {
	t.Helper()
	dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 300))
	want := movertest.Describe(t, dir)
	l.kill(t, ref, step)
	return dir, want
}

// kill runs ref's move until kip kills itself before step.
func (l *moveLab) kill(t *testing.T, ref service.Ref, step string) {
	t.Helper()
	r := l.kip(t, []string{workflow.FaultEnv + "=before:" + step}, moveArgs(ref)...)
	if r.Signal.String() != "killed" {
		t.Fatalf("kip was not killed before %s: exit %d, signal %v\n%s", step, r.ExitCode, r.Signal, r.Stderr)
	}
}

// record is the progress record of ref's unfinished move.
func (l *moveLab) record(ctx context.Context, t *testing.T, ref service.Ref) workflow.Progress {
	t.Helper()
	unfinished, err := workflow.ListUnfinished(ctx, l.c.Dynamic, kube.ClusterRecords())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unfinished {
		if p.Workflow == service.MoveWorkflow(ref) {
			return p
		}
	}
	t.Fatalf("no unfinished move of %s among %d records", ref, len(unfinished))
	return workflow.Progress{}
}

// smallTree is a service's data for the kill tests: the mover tests' tree (every kind of entry
// but a device node) and a few hundred small files.
func smallTree(t testing.TB, n int) func(dir string) {
	return func(dir string) {
		movertest.MakeTree(t, dir, 0)
		manyFiles(t, filepath.Join(dir, "many"), n, 512)
	}
}

// manyFiles writes n files of size bytes, 500 to a directory, owned by 999:999 as Postgres's are.
func manyFiles(t testing.TB, root string, n, size int) {
	t.Helper()
	data := movertest.RandomBytes(size, uint64(n))
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/500))
		if i%500 == 0 {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, 999, 999); err != nil {
				t.Fatal(err)
			}
		}
		f := filepath.Join(dir, fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(f, data[:i%size], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, 999, 999); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMoveToLonghorn moves services' data from local-path volumes onto Longhorn (the stand-in's
// real ext4 volumes, through the real CSI sidecars and kubelet) with the real kip: a Postgres-like
// service of 20,000 small files and every kind of entry; a service whose files outgrow the planned
// volume (its inodes run out), grown once; one service killed before each of the move's steps in
// turn, each run again resuming where the last was killed; then the local copies the moves kept,
// pruned. TestMoveRolledBack has the rollbacks,
// TestMovePrunedAfterBackup the moves and the prune on a cluster with backups.
func TestMoveToLonghorn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	l := setUpMoveLab(ctx, t, moveHost)
	l.project(ctx, t, "shop", "staging")

	e2e.Run(t, "Postgres-like service", func(t *testing.T) {
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "db"}
		dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 20000))
		want := movertest.Describe(t, dir)
		start := time.Now()
		r := l.kip(t, nil, moveArgs(ref)...)
		if r.ExitCode != 0 {
			t.Fatalf("kip service storage longhorn: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		t.Logf("move of %s: %s\n%s", ref, time.Since(start).Round(time.Second), r.Stderr)
		for _, s := range []string{"in 20015 files and", "Stopped service db", "Verified the copy", "Service db runs on Longhorn",
			"Its local copy stays on " + l.h.Name} {
			if !strings.Contains(r.Stderr, s) {
				t.Errorf("kip's output lacks %q", s)
			}
		}
		l.checkOnLonghorn(ctx, t, ref, dir, want)
		if r := l.kip(t, nil, moveArgs(ref)...); r.ExitCode != 0 || !strings.Contains(r.Stderr, "already keeps its data on Longhorn") {
			t.Errorf("the move run again: exit %d\n%s", r.ExitCode, r.Stderr)
		}
	})

	e2e.Run(t, "grown once when its files outgrow the volume", func(t *testing.T) {
		// 100,000 empty files hold no bytes, so the planned volume is 1 GiB, whose ext4 has
		// 65,536 inodes: the copy runs out of room and the volume grows once to 2 GiB. The
		// namespace's quota on Longhorn claims first admits the planned volume and not the grown
		// one: the grow records its size (its first write) and stops at the quota, the service
		// stopped. With the quota gone, the move run again is killed after the grow's next write,
		// the copy pod that ran out of room deleted (the volume detaches to grow offline); run
		// again, after its last, the claim asking for the new size; the run after that finishes
		// the grow, and the copy made again fits. (The API tier's node stand-in cannot run out
		// of room: the grow's writes are killed after here.)
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "uploads"}
		dir := l.service(ctx, t, ref, "1Gi", func(dir string) { manyFiles(t, filepath.Join(dir, "many"), 100000, 1) })
		want := movertest.Describe(t, dir)
		// The move counts its claim and the dump volume it makes on Longhorn at the planned
		// size, 2 GiB; the grow its claim's growth and the dump volume at the grown size, 3 GiB.
		quota := l.longhornQuota(ctx, t, ref.Namespace(), 2560<<20)
		r := l.kip(t, nil, moveArgs(ref)...)
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "The copy ran out of room on 1.0 GiB: growing the volume once, to 2.0 GiB") ||
			!strings.Contains(r.Stderr, "the volume cannot grow: ResourceQuota "+quota+" in "+ref.Namespace()+" allows ") {
			t.Fatalf("kip service storage longhorn with a quota that refuses the grow: exit %d, last line %q\n%s", r.ExitCode, r.LastLine(), r.Stderr)
		}
		if err := l.c.Kube.CoreV1().ResourceQuotas(ref.Namespace()).Delete(ctx, quota, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, write := range []string{
			`^API DELETE /api/v1/namespaces/` + ref.Namespace() + `/pods/kip-move-copy-uploads$`,
			`^API PATCH /api/v1/namespaces/` + ref.Namespace() + `/persistentvolumeclaims/kip-move-uploads$`,
		} {
			r := l.kip(t, []string{faulttest.KillAfterMatching(write)}, moveArgs(ref)...)
			faulttest.KilledMatching(t, faulttest.Result{Stderr: r.Stderr, Signal: r.Signal, Exit: r.ExitCode}, write)
		}
		r = l.kip(t, nil, moveArgs(ref)...)
		if r.ExitCode != 0 || strings.Contains(r.Stderr, "The copy ran out of room") {
			t.Fatalf("kip service storage longhorn with the quota gone, after the grow's writes: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		l.checkOnLonghorn(ctx, t, ref, dir, want)
		pvc, err := l.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "data-uploads-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q := pvc.Status.Capacity[corev1.ResourceStorage]; q.Value() != 2<<30 {
			t.Errorf("the grown volume has %s, want 2Gi", q.String())
		}
	})

	// One service killed before each step of its move in turn: each run again resumes at the
	// step the last one was killed before, applies it and is killed before the next, each in a
	// process of its own; the last run finishes the move. (The API tier kills the move after
	// each single write: internal/move.)
	e2e.Run(t, "killed before each step in turn", func(t *testing.T) {
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "k0"}
		dir, want := l.killedBefore(ctx, t, ref, moveSteps[0])
		for i, step := range moveSteps {
			if i > 0 {
				l.kill(t, ref, step)
			}
			if p := l.record(ctx, t, ref); p.Step != step || !slices.Equal(p.Completed, moveSteps[:i]) {
				t.Fatalf("killed before %s, the move's record is at step %s, with %v done; want %v done", step, p.Step, p.Completed, moveSteps[:i])
			}
		}
		if r := l.kip(t, nil, moveArgs(ref)...); r.ExitCode != 0 {
			t.Fatalf("the move run again: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		l.checkOnLonghorn(ctx, t, ref, dir, want)
	})

	e2e.Run(t, "local copies pruned", func(t *testing.T) { l.pruned(ctx, t) })
}

// TestMoveEveryWriteOfPodsAndClaimsKilled kills the move of a Postgres-like service after single
// writes in turn, on a cluster of its own with real pods (the real kubelet, containers, CSI
// sidecars and PV controller), a new service each time, and runs the move again: every run again
// ends on Longhorn with the data byte for byte and nothing of the move left. The API tier
// (internal/move, TestMoveEveryWriteKilled) kills the move after every one of its writes
// against stand-ins; here, the writes whose aftermath real parts decide: the copy pod created (a
// real kubelet starts it, a real attacher attaches the Longhorn volume) and deleted (the kubelet
// stops it, the volume detaches), the service's data claim deleted (held by the claim
// protection until no pod uses it) and created again on the Longhorn volume (bound by the real
// PV controller). Before them, a pod that is not the service's, started before the move, writes
// the data: the move refuses to copy until it is gone.
func TestMoveEveryWriteOfPodsAndClaimsKilled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	l := setUpMoveLab(ctx, t, writesHost)
	l.project(ctx, t, "shop", "staging")

	// The uninterrupted move, its writes logged, on a host whose containerd has no mover image:
	// kip imports the one it carries, and the pods run it.
	ref := service.Ref{Project: "shop", Environment: "staging", Name: "w0"}
	dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 300))
	want := movertest.Describe(t, dir)
	if d := l.moverImage(ctx, t); d != "" {
		t.Fatalf("the host holds the mover's image (%s) before any move", d)
	}
	file := filepath.Join(t.TempDir(), "writes")
	r := l.kip(t, []string{fault.WritesFileEnv + "=" + file}, moveArgs(ref)...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "Imported the data mover's image on node "+l.h.Name) {
		t.Fatalf("the uninterrupted move, the mover's image not on the host: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	l.checkOnLonghorn(ctx, t, ref, dir, want)
	if d, pin := l.moverImage(ctx, t), moverPin(t); d != pin.Digest {
		t.Fatalf("the host holds the mover's image as %q after the move, want the pinned %s", d, pin.Digest)
	}
	var all []string
	for _, w := range faulttest.Writes(t, file) {
		all = append(all, faulttest.Anonymous(w, map[string]string{ref.Name: "SVC"}))
	}
	points := labWrites(all)
	if slices.Contains(points, 0) {
		t.Fatalf("the move's import of the mover's image and writes of pods and claims found: %v, of\n%s", points, strings.Join(all, "\n"))
	}
	t.Logf("measured: the uninterrupted move made %d writes; killed after writes %v", len(all), points)

	e2e.Run(t, "a pod from before the move writing the data", func(t *testing.T) {
		// Not the service's pod: the fence keeps new pods off the volume, this one was there
		// first. The move refuses before the copy and keeps the service stopped; once the pod
		// is gone, the move run again copies what it wrote.
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "shared"}
		dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 300))
		pods := l.c.Kube.CoreV1().Pods(ref.Namespace())
		writer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "writer"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: busyboxImage,
				Command:      []string{"sh", "-c", `trap "exit 0" TERM; while :; do date >> /data/foreign; sleep 1; done`},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-shared-0"}}}}}}
		if _, err := pods.Create(ctx, writer, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := kube.Poll(ctx, 3*time.Minute, "pod writer to run", func(ctx context.Context) (bool, string, error) {
			p, err := pods.Get(ctx, "writer", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, "", nil
		}); err != nil {
			t.Fatal(err)
		}
		r := l.kip(t, nil, moveArgs(ref)...)
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "still use the volumes of service shared: writer (claim data-shared-0)") ||
			!strings.Contains(r.Stderr, "service shared stays stopped meanwhile") || strings.Contains(r.Stderr, "Copied the data") {
			t.Fatalf("the move with pod writer on the data: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		if svc, err := service.Get(ctx, l.c.Dynamic, ref); err != nil || !svc.Stopped || svc.Move == "" {
			t.Errorf("the service after the refusal: %+v, %v", svc, err)
		}
		if err := pods.Delete(ctx, "writer", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := kube.Poll(ctx, 3*time.Minute, "pod writer to go", func(ctx context.Context) (bool, string, error) {
			_, err := pods.Get(ctx, "writer", metav1.GetOptions{})
			return apierrors.IsNotFound(err), "", nil
		}); err != nil {
			t.Fatal(err)
		}
		want := movertest.Describe(t, dir)
		if !strings.Contains(want, "foreign") {
			t.Fatalf("pod writer wrote nothing to the data:\n%s", want)
		}
		if r := l.kip(t, nil, moveArgs(ref)...); r.ExitCode != 0 {
			t.Fatalf("the move once writer is gone: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		l.checkOnLonghorn(ctx, t, ref, dir, want)
	})

	for i, n := range points {
		e2e.Run(t, fmt.Sprintf("killed after write %d, %s", n, all[n-1]), func(t *testing.T) {
			ref := service.Ref{Project: "shop", Environment: "staging", Name: fmt.Sprintf("w%d", i+1)}
			dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 300))
			want := movertest.Describe(t, dir)
			// Each run makes the writes of the uninterrupted one, the image's import among them.
			l.removeMoverImage(ctx, t)
			r := l.kip(t, []string{faulttest.KillAfter(n)}, moveArgs(ref)...)
			what := faulttest.Killed(t, faulttest.Result{Stderr: r.Stderr, Signal: r.Signal, Exit: r.ExitCode}, n)
			if faulttest.Anonymous(what, map[string]string{ref.Name: "SVC"}) != all[n-1] {
				t.Fatalf("write %d of this move is %q, of the uninterrupted one %q", n, what, all[n-1])
			}
			if r := l.kip(t, nil, moveArgs(ref)...); r.ExitCode != 0 {
				t.Fatalf("the move run again: exit %d\n%s", r.ExitCode, r.Stderr)
			}
			l.checkOnLonghorn(ctx, t, ref, dir, want)
		})
	}
}

// labWrites picks, from the writes of a move (anonymous, numbered from 1), the import of the
// mover's image into the host's containerd, the copy pod created (the first pod after the move's
// own claim) and deleted, the service's data claim deleted, and the first claim created after
// that; 0 for each not found.
func labWrites(all []string) []int {
	// first is the number of the first write from write after on that matches pattern.
	first := func(after int, pattern string) int {
		re := regexp.MustCompile(pattern)
		for i := after; i > 0 && i < len(all); i++ {
			if re.MatchString(all[i]) {
				return i + 1
			}
		}
		return 0
	}
	const claimCreated = `^API POST /api/v1/namespaces/[^/]+/persistentvolumeclaims$`
	dataDeleted := first(1, `^API DELETE /api/v1/namespaces/[^/]+/persistentvolumeclaims/data-SVC-0$`)
	return []int{
		first(1, `^ssh [^ ]+: /usr/local/bin/k3s ctr --address /run/k3s/containerd/containerd.sock --namespace k8s.io images import -$`),
		first(first(1, claimCreated), `^API POST /api/v1/namespaces/[^/]+/pods$`),
		first(1, `^API DELETE /api/v1/namespaces/[^/]+/pods/kip-move-copy-SVC$`),
		dataDeleted,
		first(dataDeleted, claimCreated),
	}
}

// TestMovePrunedAfterBackup moves services on a cluster with backups and prunes their copies
// once a backup made after the move holds their data (prunedAfterBackup), on a cluster of its
// own beside TestMoveToLonghorn.
func TestMovePrunedAfterBackup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	setUpMoveLab(ctx, t, backupMoveHost).prunedAfterBackup(ctx, t)
}

// longhornQuota creates ResourceQuota "longhorn-room" in ns, which allows claims of the move's
// class extra bytes more than they ask for now, once the quota controller has counted them, and
// returns its name. It goes when the test ends, if the test has not deleted it.
func (l *moveLab) longhornQuota(ctx context.Context, t *testing.T, ns string, extra int64) string {
	t.Helper()
	quotas := l.c.Kube.CoreV1().ResourceQuotas(ns)
	res := corev1.ResourceName(move.Class + ".storageclass.storage.k8s.io/" + string(corev1.ResourceRequestsStorage))
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "longhorn-room"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{res: resource.MustParse("1Ti")}}}
	if _, err := quotas.Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := quotas.Delete(context.Background(), q.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	var used resource.Quantity
	if err := poll(ctx, 2*time.Minute, "quota "+q.Name+" counting the claims of "+ns, func(ctx context.Context) (bool, error) {
		got, err := quotas.Get(ctx, q.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var ok bool
		used, ok = got.Status.Used[res]
		return ok, nil
	}); err != nil {
		t.Fatal(err)
	}
	hard := used.DeepCopy()
	hard.Add(*resource.NewQuantity(extra, resource.BinarySI))
	// The quota controller writes the quota too (its status): the change is made on the latest
	// one, again on a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := quotas.Get(ctx, q.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Spec.Hard[res] = hard
		_, err = quotas.Update(ctx, got, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return q.Name
}

// TestMoveRolledBack runs on a cluster of its own beside TestMoveToLonghorn: a kept copy changed
// while kip was away, copied again; a comparison that fails, leaving the service stopped on its
// local data until it is rolled back; one service killed before each step up to the commit and
// rolled back; and the rollback refused after the commit.
func TestMoveRolledBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	l := setUpMoveLab(ctx, t, rollbackHost)
	l.project(ctx, t, "shop", "staging")

	t.Run("a kept copy that no longer matches is copied again", func(t *testing.T) {
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "changed"}
		dir, want := l.killedBefore(ctx, t, ref, "verify")
		l.tamperCopy(ctx, t, ref)
		r := l.kip(t, nil, moveArgs(ref)...)
		if r.ExitCode != 0 {
			t.Fatalf("the move run again: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		for _, s := range []string{"The copy kept from an earlier run no longer matches the original", "tampered: not in the original", "copying again"} {
			if !strings.Contains(r.Stderr, s) {
				t.Errorf("kip's output lacks %q", s)
			}
		}
		l.checkOnLonghorn(ctx, t, ref, dir, want)
	})

	t.Run("a failed comparison leaves the service stopped on its local data", func(t *testing.T) {
		// kip pauses before the verify of the copy it made in this run, the copy is changed, and
		// the comparison that follows is the one that fails.
		ref := service.Ref{Project: "shop", Environment: "staging", Name: "differs"}
		dir := l.service(ctx, t, ref, "1Gi", smallTree(t, 300))
		want := movertest.Describe(t, dir)
		p, paused := l.s.Paused(t, l.home, nil, "before:verify", l.args(moveArgs(ref))...)
		l.tamperCopy(ctx, t, ref)
		if err := os.Remove(paused); err != nil {
			t.Fatal(err)
		}
		r := p.Wait(t, 10*time.Minute)
		if r.ExitCode != 1 {
			t.Fatalf("the move with a copy that differs: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		cmd := "'kip service storage longhorn differs --project shop --environment staging"
		for _, s := range []string{"the copy does not match the original: 1 difference: tampered: not in the original (regular file in the copy)",
			"service differs stays stopped with its local data untouched: " + cmd + "' copies again, " + cmd + " --rollback' returns it to its local volume"} {
			if !strings.Contains(r.Stderr, s) {
				t.Errorf("kip's output lacks %q", s)
			}
		}
		if strings.Contains(r.Stderr, "copying again") {
			t.Errorf("kip copied again after a comparison of this run's copy failed:\n%s", r.Stderr)
		}
		svc, err := service.Get(ctx, l.c.Dynamic, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !svc.Stopped || svc.Phase != service.PhaseStopped || svc.Move == "" {
			t.Errorf("after the failed comparison: stopped %v, phase %s, move %q; want stopped under the move", svc.Stopped, svc.Phase, svc.Move)
		}
		if got := movertest.Describe(t, dir); got != want {
			t.Errorf("the local data changed:\n--- before\n%s\n--- after\n%s", want, got)
		}
		if r := l.kip(t, nil, "service", "start", ref.Name, "--project", ref.Project, "--environment", ref.Environment); r.ExitCode == 0 {
			t.Errorf("kip service start during the unfinished move succeeded:\n%s", r.Stderr)
		}
		if r := l.kip(t, nil, moveArgs(ref, "--rollback")...); r.ExitCode != 0 {
			t.Fatalf("--rollback: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		l.checkOnLocal(ctx, t, ref, dir, want)
	})

	for i, step := range rollbackKills {
		t.Run("rolled back after a kill before "+step, func(t *testing.T) {
			ref := service.Ref{Project: "shop", Environment: "staging", Name: fmt.Sprintf("r%d", i)}
			dir, want := l.killedBefore(ctx, t, ref, step)
			r := l.kip(t, nil, moveArgs(ref, "--rollback")...)
			if i == len(rollbackKills)-1 {
				// Committed: only forward.
				if r.ExitCode != 1 || !strings.Contains(r.Stderr, "committed") || !strings.Contains(r.Stderr, "cannot be rolled back") {
					t.Fatalf("--rollback after the commit: exit %d\n%s", r.ExitCode, r.Stderr)
				}
				if r := l.kip(t, nil, moveArgs(ref)...); r.ExitCode != 0 {
					t.Fatalf("the move run again: exit %d\n%s", r.ExitCode, r.Stderr)
				}
				l.checkOnLonghorn(ctx, t, ref, dir, want)
				return
			}
			if r.ExitCode != 0 {
				t.Fatalf("--rollback: exit %d\n%s", r.ExitCode, r.Stderr)
			}
			l.checkOnLocal(ctx, t, ref, dir, want)
		})
	}
}
