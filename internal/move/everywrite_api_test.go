//go:build kipfault

package move_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/nodestandin"
	"kipper.run/kip/test/testenv"
)

// The helper process: the test binary run again with these set moves one service against the
// parent's API server, as kip service storage longhorn NAME --no-backup --yes does.
// A rollback and a run with helperNoYes set run without --yes, off a terminal: only a new move
// asks anything.
const (
	helperKubeconfig = "KIP_MOVE_HELPER_KUBECONFIG"
	helperService    = "KIP_MOVE_HELPER_SERVICE" // project/environment/name
	helperRollback   = "KIP_MOVE_HELPER_ROLLBACK"
	helperNoYes      = "KIP_MOVE_HELPER_NO_YES"
)

// movedAt is every helper's clock, so that the commit's moved-at is the same in every run.
var movedAt = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

func init() { asHelper = faulttest.AsHelper(helperKubeconfig, helperMove) }

func helperMove(kubeconfig string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	parts := strings.Split(os.Getenv(helperService), "/")
	if len(parts) != 3 {
		return fmt.Errorf("%s=%q: want project/environment/name", helperService, os.Getenv(helperService))
	}
	ios := &cli.IOStreams{Out: os.Stdout, ErrOut: os.Stderr, Getenv: os.Getenv}
	o := move.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, os.Getenv(helperRollback) == "" && os.Getenv(helperNoYes) == ""),
		Holder: "kip service storage longhorn (helper)", KipVersion: "v0.0.0-test", NoBackup: true,
		Ref:      service.Ref{Project: parts[0], Environment: parts[1], Name: parts[2]},
		Rollback: os.Getenv(helperRollback) != "", Now: func() time.Time { return movedAt },
		// The node stand-in runs the mover as a process of its own, not from an image: there is
		// nothing to import, but the move must ask for it on the server's address.
		Deliver: func(_ context.Context, host string) (bool, error) {
			if host != everyServer {
				return false, fmt.Errorf("the mover's image asked for on %q, not on the server %s", host, everyServer)
			}
			return false, nil
		}}
	return move.Run(context.Background(), &o)
}

// moveEnv is one node's cluster in the API tier: the fence's policies, Longhorn's one-copy class
// and its node with room, the cluster record of a nano cluster grown onto Longhorn without
// backups, the console stand-in making each Service's StatefulSet, and the node stand-in running
// its pods and the mover and provisioning Longhorn's volumes as directories.
type moveEnv struct {
	e    *testenv.Env
	cl   *kube.Clients
	node *nodestandin.Standin
	dir  string
}

const (
	everyServer  = "192.0.2.10"
	everyNode    = "every-write-node"
	everyProject = "every"
	everyEnv     = "prod"
)

func newMoveEnv(ctx context.Context, t *testing.T) *moveEnv {
	t.Helper()
	e := testenv.Get(t)
	cl, err := kube.NewClients(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	m := &moveEnv{e: e, cl: cl, dir: t.TempDir()}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// A node the scheduler places the service's pods on: a kubelet's capacity, the node
	// stand-in its kubelet.
	e.ReadyNode(t, everyNode, map[string]string{corev1.LabelHostname: everyNode})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, everyNode, metav1.GetOptions{})
		if err != nil {
			return err
		}
		room := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
		n.Status.Capacity, n.Status.Allocatable = room, room
		_, err = cl.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var policies []*unstructured.Unstructured
	for _, p := range moveguard.Policies() {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		policies = append(policies, &unstructured.Unstructured{Object: u})
	}
	if err := kube.Apply(ctx, cl, policies, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: move.Class}, Provisioner: nodestandin.Driver,
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
		AllowVolumeExpansion: ptr.To(true), Parameters: map[string]string{"numberOfReplicas": "1"}}
	if _, err := cl.Kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	m.longhornNode(ctx, t)
	rec := cluster.Record{Profile: "nano", Storage: cluster.StorageLonghorn, Backups: cluster.BackupsNone, KipVersion: "v0.0.0-test", Server: everyServer}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	console := &consolestandin.Standin{Kube: cl.Kube, Dynamic: cl.Dynamic, Image: "busybox", Command: []string{"sleep", "infinity"},
		Interval: time.Second, Logf: t.Logf}
	m.node = &nodestandin.Standin{Clients: cl, Node: everyNode, Dir: filepath.Join(m.dir, "node"), Logf: t.Logf}
	go func() { console.Run(runCtx); done <- struct{}{} }()
	go func() { m.node.Run(runCtx); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": everyProject}, "spec": map[string]any{"environments": []any{map[string]any{"name": everyEnv}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "namespace "+everyProject+"-"+everyEnv, func(ctx context.Context) (bool, string, error) {
		_, err := cl.Kube.CoreV1().Namespaces().Get(ctx, everyProject+"-"+everyEnv, metav1.GetOptions{})
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// longhornNode is Longhorn's node: one disk, ready and schedulable, with 100 GiB free.
func (m *moveEnv) longhornNode(ctx context.Context, t *testing.T) {
	t.Helper()
	lh := m.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace)
	n := &longhornv1beta2.Node{ObjectMeta: metav1.ObjectMeta{Name: everyNode, Namespace: longhorn.Namespace},
		Spec: longhornv1beta2.NodeSpec{Name: everyNode, AllowScheduling: true, Disks: map[string]longhornv1beta2.DiskSpec{
			"default": {Type: longhornv1beta2.DiskTypeFilesystem, Path: "/var/lib/longhorn", AllowScheduling: true}}}}
	n, err := lh.Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) { // an earlier test's
		n, err = lh.Get(ctx, everyNode, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	ready := []longhornv1beta2.Condition{{Type: longhornv1beta2.DiskConditionTypeReady, Status: longhornv1beta2.ConditionStatusTrue},
		{Type: longhornv1beta2.DiskConditionTypeSchedulable, Status: longhornv1beta2.ConditionStatusTrue}}
	n.Status.Conditions = []longhornv1beta2.Condition{{Type: longhornv1beta2.NodeConditionTypeReady, Status: longhornv1beta2.ConditionStatusTrue},
		{Type: longhornv1beta2.NodeConditionTypeSchedulable, Status: longhornv1beta2.ConditionStatusTrue}}
	n.Status.DiskStatus = map[string]*longhornv1beta2.DiskStatus{"default": {Conditions: ready, StorageMaximum: 100 << 30, StorageAvailable: 100 << 30}}
	if _, err := lh.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// moveService creates a service of type typ on local storage on the node (its data volume, and
// a Postgres service's dump volume, local-path volumes there, the data one holding the mover
// tests' tree, with every kind of entry) and waits until it runs; it returns the data directory
// and its description.
func (m *moveEnv) moveService(ctx context.Context, t *testing.T, typ, name string) (service.Ref, string, string) {
	t.Helper()
	return m.serviceWith(ctx, t, typ, name, func(dir string) { movertest.MakeTree(t, dir, 0) })
}

// killService is moveService for a kill point: its data is a small tree (a file with an extended
// attribute and an ACL, a hard link, a symbolic link, a directory of its own mode and owner), as
// the kill points concern the move's writes, not the mover's (the uninterrupted run moves the
// full tree).
func (m *moveEnv) killService(ctx context.Context, t *testing.T, typ, name string) (service.Ref, string, string) {
	t.Helper()
	return m.serviceWith(ctx, t, typ, name, func(dir string) {
		b := movertest.Builder{T: t, Root: dir}
		b.Dir("base", 0o700, 999, 999)
		b.File("base/PG_VERSION", []byte("17\n"), 0o600, 999, 999)
		b.File("base/1259", movertest.RandomBytes(64<<10, 7), 0o600, 999, 999)
		b.Xattr("base/1259", "user.kip", []byte("kept"))
		b.Setfacl("-m", "u:1234:r", "base/PG_VERSION")
		b.Check(os.Link(b.Path("base/1259"), b.Path("hard")))
		b.Symlink("base/PG_VERSION", "version", 999, 999)
	})
}

// serviceWith is moveService with the data fill writes.
func (m *moveEnv) serviceWith(ctx context.Context, t *testing.T, typ, name string, fill func(dir string)) (service.Ref, string, string) {
	t.Helper()
	ref := service.Ref{Project: everyProject, Environment: everyEnv, Name: name}
	dir := filepath.Join(m.dir, "local", name+"-data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fill(dir)
	dump := filepath.Join(m.dir, "local", name+"-dump")
	if err := os.MkdirAll(dump, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dump, "latest.dump"), []byte("a dump of "+name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	volumes := map[string]string{"data-" + name + "-0": dir}
	if typ == "postgres" {
		volumes["dump-"+name+"-0"] = dump
	}
	for claim, path := range volumes {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "local-" + ref.Namespace() + "-" + claim, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "rancher.io/local-path"}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				StorageClassName:              "local-path",
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}},
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ref.Namespace(), Name: claim},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{everyNode}}}}}}},
			},
		}
		if _, err := m.cl.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": ref.Namespace()},
		"spec": map[string]any{"type": typ, "storage": "1Gi", "storageClass": "local-path",
			"resources": map[string]any{"cpuRequest": "50m", "memoryRequest": "32Mi"}}}}
	if _, err := m.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := service.WaitRunning(ctx, m.cl.Dynamic, m.cl.Kube, ref, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return ref, dir, movertest.Describe(t, dir)
}

// run runs the helper's move of ref with env added to its end: its standard error, the signal
// that ended it (0 when it exited) and its exit status.
func (m *moveEnv) run(t *testing.T, ref service.Ref, env ...string) (string, syscall.Signal, int) {
	t.Helper()
	r := m.start(t, ref, env...).Wait(t)
	return r.Stderr, r.Signal, r.Exit
}

// start starts the helper's move of ref with env added.
func (m *moveEnv) start(t *testing.T, ref service.Ref, env ...string) *faulttest.Process {
	t.Helper()
	return faulttest.Start(t, 5*time.Minute, append([]string{helperKubeconfig + "=" + m.e.KubeconfigPath,
		helperService + "=" + ref.Project + "/" + ref.Environment + "/" + ref.Name, fault.PollEnv + "=50ms"}, env...)...)
}

// startPaused starts the helper's move of ref paused at point (workflow.PauseEnv) and returns
// once it waits there, with the file to remove to let it go on.
func (m *moveEnv) startPaused(ctx context.Context, t *testing.T, ref service.Ref, point string) (*faulttest.Process, string) {
	t.Helper()
	pause := filepath.Join(t.TempDir(), "paused")
	h := m.start(t, ref, workflow.PauseEnv+"="+point, workflow.PauseFileEnv+"="+pause)
	if err := kube.Poll(ctx, 3*time.Minute, "the move to pause at "+point, func(context.Context) (bool, string, error) {
		_, err := os.Stat(pause)
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return h, pause
}

// releasedSettled lists the volumes once the controller-manager's volume controller has caught up
// with the claims of ns: a volume whose claim is gone, or was made again (another UID), turns
// Released (or Failed) when that controller next syncs it, which is after kip ends, at a time no test
// decides. It waits for that (a minute at most: the controller reacts to the claim's deletion
// and resyncs every 15 s) so the phase described is the one the volume settles in.
func (m *moveEnv) releasedSettled(ctx context.Context, t *testing.T, ref service.Ref) *corev1.PersistentVolumeList {
	t.Helper()
	var pvs *corev1.PersistentVolumeList
	if err := kube.Poll(ctx, time.Minute, "the volume controller to release the volumes of deleted claims", func(ctx context.Context) (bool, string, error) {
		var err error
		if pvs, err = m.cl.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{}); err != nil {
			return false, "", err
		}
		claims, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		uids := map[string]types.UID{}
		for _, c := range claims.Items {
			uids[c.Name] = c.UID
		}
		for _, pv := range pvs.Items {
			c := pv.Spec.ClaimRef
			if c == nil || c.Namespace != ref.Namespace() || !ofService(c.Name, ref) || c.UID == "" || uids[c.Name] == c.UID ||
				pv.Status.Phase == corev1.VolumeReleased || pv.Status.Phase == corev1.VolumeFailed {
				continue
			}
			return false, fmt.Sprintf("volume %s is %s, its claim %s gone", pv.Name, pv.Status.Phase, c.Name), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return pvs
}

// endState describes, with the service's name written SVC, everything a move of ref leaves: the
// service, its claims and what each is bound to, every volume its claims named (reclaim policy,
// phase, kip's and Velero's labels and annotations), the Longhorn volumes, the move's claim,
// pods, fence and record, and whether the data is byte for byte the original's on the volume the
// service's claim names and in the local directory.
func (m *moveEnv) endState(ctx context.Context, t *testing.T, ref service.Ref, dir, want string) string {
	t.Helper()
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	ns := ref.Namespace()
	svc, err := service.Get(ctx, m.cl.Dynamic, ref)
	if err != nil {
		t.Fatal(err)
	}
	add("service: class %q, stopped %v, move %q, phase %s", svc.StorageClass, svc.Stopped, svc.Move, svc.Phase)
	pvs := m.releasedSettled(ctx, t, ref)
	names := map[string]string{} // volume name → how the description calls it
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != ns || !ofService(pv.Spec.ClaimRef.Name, ref) {
			continue
		}
		kind := "local"
		if pv.Spec.CSI != nil {
			kind = "Longhorn"
		}
		names[pv.Name] = fmt.Sprintf("%s volume for %s", kind, pv.Spec.ClaimRef.Name)
	}
	claims, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if ofService(c.Name, ref) {
			add("claim %s: class %q, %s, bound to the %s", c.Name, ptr.Deref(c.Spec.StorageClassName, ""), c.Status.Phase, names[c.Spec.VolumeName])
		}
	}
	var lines []string
	for _, pv := range pvs.Items {
		name, ok := names[pv.Name]
		if !ok {
			continue
		}
		var marks []string
		for k, v := range pv.Annotations {
			if strings.HasPrefix(k, "kipper.run/") {
				if other, ok := names[v]; ok {
					v = "the " + other
				}
				marks = append(marks, "annotation "+k+"="+v)
			}
		}
		for k, v := range pv.Labels {
			if strings.HasPrefix(k, "kipper.run/") || k == velerov1.ExcludeFromBackupLabel {
				marks = append(marks, "label "+k+"="+v)
			}
		}
		sort.Strings(marks)
		lines = append(lines, fmt.Sprintf("%s: %s, %s, %s", name, pv.Spec.PersistentVolumeReclaimPolicy, pv.Status.Phase, strings.Join(marks, ", ")))
	}
	vols, err := m.cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Items {
		if name, ok := names[v.Name]; ok {
			lines = append(lines, "Longhorn's volume of the "+name)
		}
	}
	sort.Strings(lines)
	out = append(out, lines...)
	pods, err := m.cl.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: move.MoveLabel + "=" + ref.Name})
	if err != nil {
		t.Fatal(err)
	}
	add("move pods: %d", len(pods.Items))
	if _, err := m.cl.Kube.CoreV1().ConfigMaps(ns).Get(ctx, moveguard.ConfigMapName(ref.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		add("fence ConfigMap: %v", err)
	}
	n, err := m.cl.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Labels[moveguard.NamespaceLabel(ref.Name)]; ok {
		add("namespace fenced")
	}
	unfinished, err := workflow.ListUnfinished(ctx, m.cl.Dynamic, kube.ClusterRecords())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unfinished {
		if strings.HasSuffix(p.Workflow, "-"+ref.Name) || strings.HasSuffix(p.Workflow, "-"+ref.Name+"-rollback") {
			add("unfinished record %s at step %s", strings.ReplaceAll(p.Workflow, ref.Name, "SVC"), p.Step)
		}
	}
	if got := movertest.Describe(t, dir); got != want {
		add("the local data changed:\n%s", got)
	}
	claim, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-"+ref.Name+"-0", metav1.GetOptions{})
	if err == nil {
		if pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{}); err == nil && pv.Spec.CSI != nil {
			if got := movertest.Describe(t, m.node.VolumeDir(pv.Name), "lost+found"); got != want {
				add("the Longhorn volume's data differs from the original:\n%s", got)
			} else {
				add("the Longhorn volume holds the original's data")
			}
		}
	}
	return strings.ReplaceAll(strings.Join(out, "\n"), ref.Name, "SVC")
}

// done deletes ref's service once its case is checked, with its claims and their local volumes
// (a Longhorn volume goes with its claim): the StatefulSet and pod go with the service, the node
// keeps room for the next cases' pods, and what the stand-ins and kip list stays as short as at
// the start rather than growing by a service's volumes at each of some 200 cases.
func (m *moveEnv) done(ctx context.Context, t *testing.T, ref service.Ref) {
	t.Helper()
	if err := m.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Delete(ctx, ref.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	claims, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvs, err := m.cl.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if ofService(c.Name, ref) {
			if err := m.cl.Kube.CoreV1().PersistentVolumeClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	for _, pv := range pvs.Items {
		if r := pv.Spec.ClaimRef; r != nil && r.Namespace == ref.Namespace() && ofService(r.Name, ref) && pv.Spec.CSI == nil {
			if err := m.cl.Kube.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
}

// ofService reports whether claim is one of ref's or its move's.
func ofService(claim string, ref service.Ref) bool {
	return slices.Contains([]string{"data-" + ref.Name + "-0", "dump-" + ref.Name + "-0", "kip-move-" + ref.Name}, claim)
}

// TestMoveEveryWriteKilled moves a Postgres service (data and dump volumes) and a Redis one
// (data only), each killed after each single write of its move in turn, a new service each time,
// then runs the move again; every run again ends as the move never interrupted did: the same
// claims bound to the same kinds of volume, the same policies, labels and annotations, no leaked
// volume, nothing of the move left, and the original's data byte for byte on Longhorn, the local
// copy untouched.
func TestMoveEveryWriteKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	for _, typ := range []string{"postgres", "redis"} {
		t.Run(typ, func(t *testing.T) {
			ref, dir, want := m.moveService(ctx, t, typ, typ+"-w0")
			reference, all := m.uninterrupted(ctx, t, ref, dir, want)
			if !strings.Contains(reference, "the Longhorn volume holds the original's data") {
				t.Fatalf("the uninterrupted move did not put the data on Longhorn:\n%s", reference)
			}
			m.done(ctx, t, ref)
			// From the move's first progress record to the one that says it finished, the
			// service cannot be deleted: the record is written before the move changes anything,
			// its move annotation only once the fence holds.
			var records []int
			for i, w := range all {
				if strings.Contains(w, "/configmaps/"+kube.RecordsConfigMap) {
					records = append(records, i+1)
				}
			}
			if len(records) < 2 {
				t.Fatalf("the move wrote its progress record %d times:\n%s", len(records), strings.Join(all, "\n"))
			}
			start := time.Now()
			for i := 1; i <= len(all); i++ {
				ref, dir, want := m.killService(ctx, t, typ, fmt.Sprintf("%s-k%d", typ, i))
				m.killedAfter(t, ref, i, all[i-1])
				// Once recorded, the move goes on without --yes: it asks nothing.
				var env []string
				if i >= records[0] {
					env = append(env, helperNoYes+"=1")
				}
				if i >= records[0] && i < records[len(records)-1] {
					m.deleteRefused(ctx, t, ref, fmt.Sprintf("killed after write %d (%s)", i, all[i-1]))
				}
				again, sig, code := m.run(t, ref, env...)
				if sig != 0 || code != 0 {
					t.Errorf("the move run again after a kill after write %d (%s): signal %v, exit %d\n%s", i, all[i-1], sig, code, again)
					continue
				}
				if got := m.endState(ctx, t, ref, dir, want); got != reference {
					t.Errorf("killed after write %d (%s), the run again ends as\n%s\nnot as the uninterrupted move:\n%s\nits output:\n%s", i, all[i-1], got, reference, again)
				}
				m.done(ctx, t, ref)
			}
			t.Logf("measured: %d kill points, each a move killed and run again, in %s", len(all), time.Since(start).Round(time.Second))
		})
	}
}

// deleteRefused checks that kip service delete refuses ref, whose move is unfinished (when).
func (m *moveEnv) deleteRefused(ctx context.Context, t *testing.T, ref service.Ref, when string) {
	t.Helper()
	ios := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	o := &service.ServiceOptions{Ref: ref, Options: service.Options{Kube: func() (*kube.Clients, error) { return m.cl, nil },
		Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, true)}}
	if err := service.Delete(ctx, o); err == nil || !strings.Contains(err.Error(), "cannot delete service "+ref.String()+": its move to longhorn is not finished") {
		t.Fatalf("kip service delete %s, its move %s: %v", ref, when, err)
	}
}

// uninterrupted runs ref's move (or with env, its rollback) to its end, counting its writes, and
// returns the state it ends in and what each write was.
func (m *moveEnv) uninterrupted(ctx context.Context, t *testing.T, ref service.Ref, dir, want string, env ...string) (string, []string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "writes")
	start := time.Now()
	stderr, sig, code := m.run(t, ref, append(env, fault.WritesFileEnv+"="+file)...)
	if sig != 0 || code != 0 {
		t.Fatalf("the uninterrupted run: signal %v, exit %d\n%s", sig, code, stderr)
	}
	took := time.Since(start)
	state := m.endState(ctx, t, ref, dir, want)
	var all []string
	for _, w := range faulttest.Writes(t, file) {
		all = append(all, anonymous(w, ref))
	}
	t.Logf("measured: the uninterrupted run made %d writes in %s; it ends as:\n%s", len(all), took.Round(time.Millisecond), state)
	return state, all
}

// killedAfter runs ref's move (or with env, its rollback) killed after its write n, which the
// uninterrupted run logged as what.
func (m *moveEnv) killedAfter(t *testing.T, ref service.Ref, n int, what string, env ...string) {
	t.Helper()
	killed := faulttest.Killed(t, m.start(t, ref, append(env, faulttest.KillAfter(n))...).Wait(t), n)
	// The numbering is the same in every run: the write killed after is the uninterrupted run's.
	if what != "" && anonymous(killed, ref) != what {
		t.Fatalf("write %d of this run is %q, of the uninterrupted run %q", n, anonymous(killed, ref), what)
	}
}

// anonymous is a write's description with ref's name written SVC (faulttest.Anonymous): the
// same for the same write of a move of any service.
func anonymous(what string, ref service.Ref) string {
	return faulttest.Anonymous(what, map[string]string{ref.Name: "SVC"})
}

// TestMoveRollbackEveryWriteKilled rolls back moves of a Postgres service: killed after each
// write of the move before its commit point in turn, then rolled back, and killed before its
// commit then rolled back killed after each write of the rollback in turn, then rolled back
// again. Every rollback ends as the uninterrupted one did: the service running on its local
// volumes, their policies as before the move, nothing of the move left, the data untouched. A
// move killed past its commit point is refused a rollback and finishes forward.
func TestMoveRollbackEveryWriteKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	rollback := helperRollback + "=1"
	beforeCommit := func(ref service.Ref) {
		t.Helper()
		if stderr, sig, _ := m.run(t, ref, workflow.FaultEnv+"=before:commit"); sig != syscall.SIGKILL {
			t.Fatalf("the move killed before its commit: signal %v\n%s", sig, stderr)
		}
	}
	ref, dir, want := m.moveService(ctx, t, "postgres", "rb0")
	beforeCommit(ref)
	reference, all := m.uninterrupted(ctx, t, ref, dir, want, rollback)
	if !strings.Contains(reference, `service: class "local-path", stopped false, move "", phase Running`) {
		t.Fatalf("the uninterrupted rollback did not start the service on local storage:\n%s", reference)
	}
	m.done(ctx, t, ref)
	start := time.Now()
	for i := 1; i <= len(all); i++ {
		ref, dir, want := m.killService(ctx, t, "postgres", fmt.Sprintf("rb%d", i))
		beforeCommit(ref)
		m.killedAfter(t, ref, i, all[i-1], rollback)
		again, sig, code := m.run(t, ref, rollback)
		if sig != 0 || code != 0 {
			t.Errorf("the rollback run again after a kill after write %d (%s): signal %v, exit %d\n%s", i, all[i-1], sig, code, again)
			continue
		}
		if got := m.endState(ctx, t, ref, dir, want); got != reference {
			t.Errorf("killed after write %d (%s), the rollback run again ends as\n%s\nnot as the uninterrupted one:\n%s\nits output:\n%s", i, all[i-1], got, reference, again)
		}
		m.done(ctx, t, ref)
	}
	t.Logf("measured: %d kill points of the rollback in %s", len(all), time.Since(start).Round(time.Second))

	start = time.Now()
	points := 0
	for i := 1; ; i++ {
		ref, dir, want := m.killService(ctx, t, "postgres", fmt.Sprintf("mv%d", i))
		m.killedAfter(t, ref, i, "")
		points++
		pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, "local-"+ref.Namespace()+"-data-"+ref.Name+"-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pv.Annotations[move.MovedToAnnotation] != "" {
			// Past the commit point: only forward.
			stderr, _, code := m.run(t, ref, rollback)
			if code != 1 || !strings.Contains(stderr, "committed") || !strings.Contains(stderr, "cannot be rolled back") {
				t.Errorf("--rollback after a kill after write %d, past the commit point: exit %d\n%s", i, code, stderr)
			}
			if again, sig, code := m.run(t, ref); sig != 0 || code != 0 || !strings.Contains(m.endState(ctx, t, ref, dir, want), "the Longhorn volume holds the original's data") {
				t.Errorf("the move run forward after a kill after write %d, past the commit point: signal %v, exit %d\n%s", i, sig, code, again)
			}
			m.done(ctx, t, ref)
			break
		}
		again, sig, code := m.run(t, ref, rollback)
		if sig != 0 || code != 0 {
			t.Errorf("the rollback after a kill after write %d of the move: signal %v, exit %d\n%s", i, sig, code, again)
			continue
		}
		if got := m.endState(ctx, t, ref, dir, want); got != reference {
			t.Errorf("killed after write %d of the move, the rollback ends as\n%s\nnot as the uninterrupted one:\n%s\nits output:\n%s", i, got, reference, again)
		}
		m.done(ctx, t, ref)
	}
	t.Logf("measured: the move killed after each of its %d writes up to its commit point, each rolled back, in %s", points, time.Since(start).Round(time.Second))
}

// TestMoveRetainsBothVolumesUntilTheirClaimsGo: with the move paused right before it deletes the
// claims, both volumes' reclaim policy is set back to Delete, as an operator or a tool could; the
// move sets Retain again before each claim goes, says so, and both volumes keep their data: the
// local one retained and released with the original's data, the Longhorn one bound to the
// service's claim with the copy, its policy then the class's again.
func TestMoveRetainsBothVolumesUntilTheirClaimsGo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	ref, dir, want := m.moveService(ctx, t, "postgres", "retained")
	h, pause := m.startPaused(ctx, t, ref, "before:claim")
	claim, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "kip-move-"+ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := "local-" + ref.Namespace() + "-data-" + ref.Name + "-0"
	for _, pv := range []string{old, claim.Spec.VolumeName} {
		patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
		if _, err := m.cl.Kube.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	r := h.Wait(t)
	stderr, sig, code := r.Stderr, r.Signal, r.Exit
	if sig != 0 || code != 0 {
		t.Fatalf("the move: signal %v, exit %d\n%s", sig, code, stderr)
	}
	for _, pv := range []string{old, claim.Spec.VolumeName} {
		if want := "Volume " + pv + "'s reclaim policy is Delete again, not the Retain the move set: setting Retain before its claim is deleted"; !strings.Contains(stderr, want) {
			t.Errorf("the move does not say %q:\n%s", want, stderr)
		}
	}
	if got := m.endState(ctx, t, ref, dir, want); !strings.Contains(got, "local volume for data-SVC-0: Retain, Released, annotation kipper.run/moved-at=") ||
		!strings.Contains(got, "Longhorn volume for data-SVC-0: Delete, Bound") || !strings.Contains(got, "the Longhorn volume holds the original's data") {
		t.Errorf("after the move:\n%s", got)
	}
}

// TestMoveRefusesWhileAnotherPodUsesTheData: a pod that is not the service's, started before the
// move, mounts the service's data claim; the fence does not stop a pod already running, so the
// move refuses to copy while it runs, naming it, and leaves the service stopped; once the pod is
// gone the same command finishes the move with the original's data on Longhorn.
func TestMoveRefusesWhileAnotherPodUsesTheData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	ref, dir, want := m.moveService(ctx, t, "postgres", "shared")
	pods := m.cl.Kube.CoreV1().Pods(ref.Namespace())
	reader := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader"}, Spec: corev1.PodSpec{NodeName: everyNode,
		Containers: []corev1.Container{{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
		Volumes:    []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-shared-0"}}}}}}
	if _, err := pods.Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "pod reader running", func(ctx context.Context) (bool, string, error) {
		p, err := pods.Get(ctx, "reader", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, "", err
	}); err != nil {
		t.Fatal(err)
	}
	stderr, sig, code := m.run(t, ref)
	if sig != 0 || code != 1 || !strings.Contains(stderr, "still use the volumes of service shared: reader (claim data-shared-0)") ||
		!strings.Contains(stderr, "service shared stays stopped meanwhile") || strings.Contains(stderr, "Copied the data") {
		t.Fatalf("the move with pod reader on the data: signal %v, exit %d\n%s", sig, code, stderr)
	}
	if svc, err := service.Get(ctx, m.cl.Dynamic, ref); err != nil || !svc.Stopped || svc.Move == "" {
		t.Errorf("the service after the refusal: %+v, %v", svc, err)
	}
	if err := pods.Delete(ctx, "reader", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "pod reader gone", func(ctx context.Context) (bool, string, error) {
		_, err := pods.Get(ctx, "reader", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "", nil
	}); err != nil {
		t.Fatal(err)
	}
	if stderr, sig, code := m.run(t, ref); sig != 0 || code != 0 {
		t.Fatalf("the move once reader is gone: signal %v, exit %d\n%s", sig, code, stderr)
	}
	if got := m.endState(ctx, t, ref, dir, want); !strings.Contains(got, "the Longhorn volume holds the original's data") || strings.Contains(got, "the local data changed") {
		t.Errorf("after the move:\n%s", got)
	}
}

// TestMoveDecidesUnderTheLock: while one move of a service holds the cluster lock (paused before
// its first step), a second kip moving the same service is refused by the lock before it reads,
// counts or writes anything; the first then finishes.
func TestMoveDecidesUnderTheLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	ref, dir, want := m.moveService(ctx, t, "postgres", "twice")
	first, pause := m.startPaused(ctx, t, ref, "before:fence")
	file := filepath.Join(t.TempDir(), "writes")
	stderr, sig, code := m.run(t, ref, fault.WritesFileEnv+"="+file)
	if sig != 0 || code != 1 || !strings.Contains(stderr, "another kip command holds the cluster lock: kip service storage longhorn (helper)") ||
		strings.Contains(stderr, "Count the data") {
		t.Errorf("the second move while the first holds the lock: signal %v, exit %d\n%s", sig, code, stderr)
	}
	if data, err := os.ReadFile(file); !os.IsNotExist(err) {
		t.Errorf("the refused move wrote:\n%s (%v)", data, err)
	}
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	if r := first.Wait(t); r.Signal != 0 || r.Exit != 0 {
		t.Fatalf("the first move: signal %v, exit %d\n%s", r.Signal, r.Exit, r.Stderr)
	}
	if got := m.endState(ctx, t, ref, dir, want); !strings.Contains(got, "the Longhorn volume holds the original's data") {
		t.Errorf("after the move:\n%s", got)
	}
}

// TestMoveWithItsRecordLostEveryWriteKilled: a move of a Postgres service killed after each of
// its writes in turn, its progress record then lost (deleted, as a restore of the cluster's
// records from before the move would), and run again the way its state allows. Before the
// commit point, --rollback rebuilds what to undo from the volumes and ends as an uninterrupted
// rollback; past it, --rollback is refused naming the command that goes on, and the move run
// again finishes from the volumes, ending as an uninterrupted move. A service stopped before the
// move stays stopped either way (the fence, then the committed volume, say it was).
func TestMoveWithItsRecordLostEveryWriteKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	m := newMoveEnv(ctx, t)
	rollback := helperRollback + "=1"
	ref, dir, want := m.killService(ctx, t, "postgres", "lf0")
	forward, all := m.uninterrupted(ctx, t, ref, dir, want)
	m.done(ctx, t, ref)
	ref, dir, want = m.killService(ctx, t, "postgres", "lr0")
	if stderr, sig, _ := m.run(t, ref, workflow.FaultEnv+"=before:commit"); sig != syscall.SIGKILL {
		t.Fatalf("the move killed before its commit: signal %v\n%s", sig, stderr)
	}
	back, _ := m.uninterrupted(ctx, t, ref, dir, want, rollback)
	m.done(ctx, t, ref)
	lose := func(ref service.Ref) {
		t.Helper()
		if err := workflow.Forget(ctx, m.cl.Dynamic, kube.ClusterRecords(), service.MoveWorkflow(ref)); err != nil {
			t.Fatal(err)
		}
	}
	committed := func(ref service.Ref) bool {
		t.Helper()
		pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, "local-"+ref.Namespace()+"-data-"+ref.Name+"-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pv.Annotations[move.MovedToAnnotation] != ""
	}
	start := time.Now()
	for i := 1; i <= len(all); i++ {
		ref, dir, want := m.killService(ctx, t, "postgres", fmt.Sprintf("lk%d", i))
		m.killedAfter(t, ref, i, all[i-1])
		lose(ref)
		reference, env := back, []string{rollback}
		if committed(ref) {
			// Refused while the move is unfinished; once its start step removed the move's
			// marks, there is nothing to roll back.
			stderr, _, code := m.run(t, ref, rollback)
			refused := code == 1 && strings.Contains(stderr, "cannot be rolled back: kip has no record of it, and 'kip service storage longhorn "+ref.Name)
			if !refused && (code != 0 || !strings.Contains(stderr, "has no unfinished move to roll back")) {
				t.Errorf("--rollback, its record lost after a kill after write %d (%s), past the commit point: exit %d\n%s", i, all[i-1], code, stderr)
			}
			reference, env = forward, []string{helperNoYes + "=1"}
		}
		again, sig, code := m.run(t, ref, env...)
		if sig != 0 || code != 0 {
			t.Errorf("run again, its record lost after a kill after write %d (%s): signal %v, exit %d\n%s", i, all[i-1], sig, code, again)
			continue
		}
		// Killed after the move's last change to the service (its start), the run again has
		// nothing left to do, and console-api starts the service on its own: the end state is
		// the one it reaches.
		if strings.Contains(again, "already keeps its data on Longhorn") && strings.Contains(reference, "phase Running") {
			if err := service.WaitRunning(ctx, m.cl.Dynamic, m.cl.Kube, ref, time.Minute); err != nil {
				t.Errorf("its record lost after a kill after write %d (%s), the service does not start: %v", i, all[i-1], err)
			}
		}
		if got := m.endState(ctx, t, ref, dir, want); got != reference {
			t.Errorf("its record lost after a kill after write %d (%s), the run again ends as\n%s\nnot as\n%s\nits output:\n%s", i, all[i-1], got, reference, again)
		}
		m.done(ctx, t, ref)
	}
	t.Logf("measured: %d kill points, each with the record lost, in %s", len(all), time.Since(start).Round(time.Second))

	// A service stopped before its move stays stopped, rolled back or moved, its record lost.
	for _, point := range []string{"before:commit", "before:claim"} {
		ref, _, _ := m.killService(ctx, t, "postgres", "ls-"+strings.TrimPrefix(point, "before:"))
		if err := service.SetStopped(ctx, m.cl.Dynamic, ref, true); err != nil {
			t.Fatal(err)
		}
		if err := service.WaitStopped(ctx, m.cl.Dynamic, m.cl.Kube, ref, time.Minute); err != nil {
			t.Fatal(err)
		}
		if stderr, sig, _ := m.run(t, ref, workflow.FaultEnv+"="+point); sig != syscall.SIGKILL {
			t.Fatalf("the move of a stopped service killed %s: signal %v\n%s", point, sig, stderr)
		}
		lose(ref)
		env := []string{rollback}
		if committed(ref) {
			env = []string{helperNoYes + "=1"}
		}
		if stderr, sig, code := m.run(t, ref, env...); sig != 0 || code != 0 {
			t.Fatalf("run again after a kill %s, its record lost: signal %v, exit %d\n%s", point, sig, code, stderr)
		}
		svc, err := service.Get(ctx, m.cl.Dynamic, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !svc.Stopped || svc.Move != "" {
			t.Errorf("the service stopped before its move, killed %s, its record lost: stopped %v, move %q afterwards", point, svc.Stopped, svc.Move)
		}
		m.done(ctx, t, ref)
	}
}
