package move_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/nodestandin"
	"kipper.run/kip/test/testenv"
)

// asHelper, set by everywrite_api_test.go (built with -tags kipfault), runs the binary as the
// helper process that moves a service when its environment asks for that, and never returns then.
var asHelper = func() {}

// TestMain shares one API test environment among this package's tests. The binary run again by
// the node stand-in for a mover pod runs the mover; run as the helper, it runs one move.
func TestMain(m *testing.M) {
	nodestandin.MoverMain()
	asHelper()
	os.Exit(testenv.Main(m))
}

type fixture struct {
	e      *testenv.Env
	cl     *kube.Clients
	errOut *bytes.Buffer
	opts   move.Options
}

func setup(ctx context.Context, t *testing.T, rec cluster.Record) *fixture {
	t.Helper()
	e := testenv.Get(t)
	cl, err := kube.NewClients(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		t.Fatal(err)
	}
	f := &fixture{e: e, cl: cl, errOut: &bytes.Buffer{}}
	ios := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: f.errOut, Getenv: func(string) string { return "" }}
	f.opts = move.Options{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios),
		Prompter: cli.NewPrompter(ios, true), Holder: "kip service storage longhorn (test)", KipVersion: "v0.0.0-test",
		Deliver: func(context.Context, string) (bool, error) {
			return false, errors.New("this tier's tests end before a mover pod: no node to put the mover's image on")
		}}
	return f
}

// service creates project p's environment namespace, a postgres Service and its data claim bound
// to pv.
func (f *fixture) service(ctx context.Context, t *testing.T, ref service.Ref, pv *corev1.PersistentVolume, edit func(*unstructured.Unstructured)) {
	t.Helper()
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": ref.Project}, "spec": map[string]any{"environments": []any{map[string]any{"name": ref.Environment}}}}}
	if edit != nil {
		edit(p)
	}
	if _, err := f.cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ref.Namespace(), Labels: map[string]string{service.ProjectLabel: ref.Project}}}
	if _, err := f.e.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace()}, "spec": map[string]any{"type": "postgres", "storage": "1Gi"}}}
	if _, err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := "data-" + ref.Name + "-0"
	pv.Name = "pv-" + ref.Namespace()
	pv.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ref.Namespace(), Name: claim}
	if _, err := f.e.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.e.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ref.Namespace()}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new(string), VolumeName: pv.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.e.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "claim "+claim+" bound", func(ctx context.Context) (bool, string, error) {
		c, err := f.e.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, claim, metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound, "", err
	}); err != nil {
		t.Fatal(err)
	}
}

func localPV(node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/rancher/k3s/storage/x"}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
	}}
}

// TestMoveRefusesBeforeChangingAnything: each refusal a move makes before it stops anything,
// through move.Run against the real API server, and that it changed nothing.
func TestMoveRefusesBeforeChangingAnything(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	longhorn := cluster.Record{Profile: "nano", Storage: cluster.StorageLonghorn, Backups: cluster.BackupsNone, KipVersion: "v0.0.0-test"}
	f := setup(ctx, t, longhorn)
	run := func(ref service.Ref, noBackup bool) error {
		o := f.opts
		o.Ref, o.NoBackup = ref, noBackup
		return move.Run(ctx, &o)
	}

	noBackups := service.Ref{Project: "nb", Environment: "prod", Name: "db"}
	f.service(ctx, t, noBackups, localPV("node-a"), nil)
	if err := run(noBackups, false); err == nil || !strings.Contains(err.Error(), "this cluster has no backups") || !strings.Contains(err.Error(), "pass --no-backup to move anyway") {
		t.Errorf("no backups, no --no-backup: %v", err)
	}

	deleting := service.Ref{Project: "gone", Environment: "prod", Name: "db"}
	f.service(ctx, t, deleting, localPV("node-a"), func(p *unstructured.Unstructured) { p.SetFinalizers([]string{"kipper.run/test"}) })
	if err := f.cl.Dynamic.Resource(service.ProjectsGVR).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := run(deleting, true); err == nil || !strings.Contains(err.Error(), "project gone is being deleted: its services cannot move") {
		t.Errorf("project being deleted: %v", err)
	}

	notLocal := service.Ref{Project: "nfs", Environment: "prod", Name: "db"}
	f.service(ctx, t, notLocal, &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
		NFS: &corev1.NFSVolumeSource{Server: "192.0.2.1", Path: "/export"}}}}, nil)
	if err := run(notLocal, true); err == nil || !strings.Contains(err.Error(), "which is not a local volume on one node") {
		t.Errorf("an NFS volume: %v", err)
	}

	onLonghorn := service.Ref{Project: "lh", Environment: "prod", Name: "db"}
	f.service(ctx, t, onLonghorn, &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
		CSI: &corev1.CSIPersistentVolumeSource{Driver: "driver.longhorn.io", VolumeHandle: "pvc-1"}}}}, nil)
	if err := run(onLonghorn, true); err != nil || !strings.Contains(f.errOut.String(), "already keeps its data on Longhorn (volume pv-lh-prod)") {
		t.Errorf("already on Longhorn: %v\n%s", err, f.errOut)
	}

	lost := service.Ref{Project: "lost", Environment: "prod", Name: "db"}
	f.service(ctx, t, lost, localPV("node-a"), nil)
	if err := service.SetMove(ctx, f.cl.Dynamic, lost, "longhorn"); err != nil {
		t.Fatal(err)
	}
	if err := run(lost, true); err == nil || !strings.Contains(err.Error(), "kip has no record of that move (it was lost): undo it with 'kip service storage longhorn db --project lost --environment prod --rollback'") {
		t.Errorf("a move marked but unrecorded: %v", err)
	}

	// Backups on, none completed: the refusal names kip backup create for the project.
	if _, err := cluster.UpdateRecord(ctx, f.cl.Dynamic, func(r *cluster.Record, _ bool) error { r.Backups = cluster.BackupsExternal; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := run(noBackups, true); err == nil || !strings.Contains(err.Error(), "a move needs a completed backup of project nb") ||
		!strings.Contains(err.Error(), "back it up with 'kip backup create --project nb --wait'") || strings.Count(err.Error(), "kip backup create") != 1 {
		t.Errorf("backups without a completed one: %v; want the one command for the project", err)
	}

	// A cluster still on local storage.
	if _, err := cluster.UpdateRecord(ctx, f.cl.Dynamic, func(r *cluster.Record, _ bool) error { r.Storage = cluster.StorageLocal; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := run(noBackups, true); err == nil || !strings.Contains(err.Error(), "switch it to Longhorn first with 'kip cluster storage longhorn'") {
		t.Errorf("local storage: %v", err)
	}

	// Nothing changed: no fence, no move annotation but the one the test set, no retained volume.
	for _, ref := range []service.Ref{noBackups, deleting, notLocal} {
		s, err := service.Get(ctx, f.cl.Dynamic, ref)
		if err != nil && ref != deleting {
			t.Fatal(err)
		}
		if s != nil && (s.Move != "" || s.Stopped) {
			t.Errorf("%s changed: %+v", ref, s)
		}
		if ns, err := f.e.Kube.CoreV1().Namespaces().Get(ctx, ref.Namespace(), metav1.GetOptions{}); err != nil || ns.Labels["kipper.run/storage-move"] != "" {
			t.Errorf("%s: namespace %v, %v", ref, ns.Labels, err)
		}
	}
	if pv, err := f.e.Kube.CoreV1().PersistentVolumes().Get(ctx, "pv-nb-prod", metav1.GetOptions{}); err != nil || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the local volume changed: %v %v", pv.Spec.PersistentVolumeReclaimPolicy, err)
	}
}
