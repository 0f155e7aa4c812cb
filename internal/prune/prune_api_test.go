package prune_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/prune"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/testenv"
)

// asHelper, set by everywrite_api_test.go (built with -tags kipfault), runs the binary as the
// helper process that prunes one service's copy when its environment asks for that, and never
// returns then.
var asHelper = func() {}

func TestMain(m *testing.M) {
	asHelper()
	os.Exit(testenv.Main(m))
}

// now is the time every case is judged at.
var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

const server = "prune-srv"

type fixture struct {
	e  *testenv.Env
	cl *kube.Clients
}

// setup connects to the test API server with a server Node that no kubelet runs, kept Ready so
// that pods on it keep the status a case gives them, and Longhorn's and Velero's namespaces.
func setup(t *testing.T) *fixture {
	t.Helper()
	e := testenv.Get(t)
	cl, err := kube.NewClients(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, ns := range []string{longhorn.Namespace, components.VeleroNamespace} {
		if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	e.ReadyNode(t, server, map[string]string{"node-role.kubernetes.io/control-plane": "true"})
	return &fixture{e: e, cl: cl}
}

// moved is one service's state after its move, as a case sets it up.
type moved struct {
	ref service.Ref
	typ string
	// movedAt is when the move committed; readyAt when the pod's Ready condition last turned
	// true, startedAt when its container's current run started (zero: readyAt).
	movedAt, readyAt, startedAt time.Time
	notReady                    bool
	// replicas is the volume's numberOfReplicas; healthy how many of its replicas are current.
	replicas, healthy int
	moveUnfinished    bool
}

func (f *fixture) record(t *testing.T, backups string) cluster.Record {
	t.Helper()
	rec := cluster.Record{Profile: "nano", Storage: cluster.StorageLonghorn, Backups: backups, Server: "192.0.2.10", KipVersion: "v0.0.0-test"}
	if _, err := cluster.UpdateRecord(t.Context(), f.cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		t.Fatal(err)
	}
	return rec
}

func oldVolume(ref service.Ref) string { return "pv-local-" + ref.Namespace() + "-" + ref.Name }
func newVolume(ref service.Ref) string { return "pvc-lh-" + ref.Namespace() + "-" + ref.Name }
func dataClaim(ref service.Ref) string { return "data-" + ref.Name + "-0" }

// service creates what a finished move leaves: the project's namespace, the Service, the
// retained local volume annotated by the commit, the Longhorn volume bound to the service's
// claim, its Longhorn Volume and replicas, and the service's pod.
func (f *fixture) service(t *testing.T, m moved) {
	t.Helper()
	ctx := t.Context()
	ref := m.ref
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ref.Namespace(), Labels: map[string]string{service.ProjectLabel: ref.Project}}}
	if _, err := f.cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if m.typ == "" {
		m.typ = "redis"
	}
	ann := map[string]any{}
	if m.moveUnfinished {
		ann[service.MoveAnnotation] = "longhorn"
	}
	svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace(), "annotations": ann},
		"spec":     map[string]any{"type": m.typ, "storage": "1Gi", "storageClass": move.Class}}}
	if _, err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := dataClaim(ref)
	old := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: oldVolume(ref), Annotations: map[string]string{
			move.MovedToAnnotation: newVolume(ref), move.MovedAtAnnotation: m.movedAt.Format(time.RFC3339)}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "local-path",
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: cluster.LocalStorageDir + "/" + oldVolume(ref) + "_" + ref.Namespace() + "_" + claim}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{server}}}}}}},
			// The original claim, deleted at the commit.
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ref.Namespace(), Name: claim, UID: "0e3b6f1c-0000-4000-8000-000000000001"},
		},
	}
	lh := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: newVolume(ref)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              move.Class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: "driver.longhorn.io", VolumeHandle: newVolume(ref)}},
			ClaimRef: &corev1.ObjectReference{Namespace: ref.Namespace(), Name: claim},
		},
	}
	for _, pv := range []*corev1.PersistentVolume{old, lh} {
		if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := pv.Name
		t.Cleanup(func() {
			_ = f.cl.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ref.Namespace()}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(move.Class), VolumeName: lh.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "claim "+claim+" bound", func(ctx context.Context) (bool, string, error) {
		c, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, claim, metav1.GetOptions{})
		return err == nil && c.Status.Phase == corev1.ClaimBound, "", err
	}); err != nil {
		t.Fatal(err)
	}
	f.longhornVolume(t, ref, m.replicas, m.healthy)
	f.pod(t, m)
}

// longhornVolume creates the Longhorn Volume asking for replicas copies, with healthy current
// replicas and one rebuilding for each copy missing.
func (f *fixture) longhornVolume(t *testing.T, ref service.Ref, replicas, healthy int) {
	t.Helper()
	ctx := t.Context()
	if replicas == 0 {
		replicas, healthy = 1, 1
	}
	api := f.cl.Longhorn.LonghornV1beta2()
	v := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: newVolume(ref), Namespace: longhorn.Namespace},
		Spec: testenv.LonghornVolumeSpec(1<<30, replicas)}
	if _, err := api.Volumes(longhorn.Namespace).Create(ctx, v, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = api.Volumes(longhorn.Namespace).Delete(context.Background(), v.Name, metav1.DeleteOptions{})
	})
	for i := range replicas {
		r := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-r-%d", v.Name, i), Namespace: longhorn.Namespace,
			Labels: map[string]string{"longhornvolume": v.Name}}}
		r.Spec.VolumeName, r.Spec.NodeID, r.Spec.Active, r.Spec.DataEngine = v.Name, server, true, "v1"
		if i < healthy {
			r.Spec.HealthyAt, r.Spec.LastHealthyAt = "2026-12-01T10:00:00Z", "2026-12-01T10:00:00Z"
		}
		if _, err := api.Replicas(longhorn.Namespace).Create(ctx, r, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := r.Name
		t.Cleanup(func() {
			_ = api.Replicas(longhorn.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
}

// pod creates the service's pod on the server node, mounting its claim, with the status the case
// gives it: no kubelet runs there to change it.
func (f *fixture) pod(t *testing.T, m moved) {
	t.Helper()
	ctx := t.Context()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: m.ref.Name + "-0", Namespace: m.ref.Namespace(), Labels: map[string]string{service.Label: m.ref.Name}},
		Spec: corev1.PodSpec{NodeName: server, Containers: []corev1.Container{{Name: "main", Image: "busybox"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Volumes:     []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: dataClaim(m.ref)}}}}}}
	created, err := f.cl.Kube.CoreV1().Pods(m.ref.Namespace()).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.setPod(t, created, m)
}

func (f *fixture) setPod(t *testing.T, p *corev1.Pod, m moved) {
	t.Helper()
	started := m.startedAt
	if started.IsZero() {
		started = m.readyAt
	}
	ready := corev1.ConditionTrue
	if m.notReady {
		ready = corev1.ConditionFalse
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.NewTime(m.readyAt)}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "busybox", Ready: !m.notReady, RestartCount: 0,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}}}}
	if !m.startedAt.IsZero() {
		p.Status.ContainerStatuses[0].RestartCount = 1
	}
	if _, err := f.cl.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// backup creates a Velero backup of ref's namespace started at started, with the file-system
// backup of its data claim (as bound now) in phase pvb.
func (f *fixture) backup(t *testing.T, name string, ref service.Ref, started time.Time, edit func(*velerov1.Backup)) {
	t.Helper()
	ctx := t.Context()
	b := &velerov1.Backup{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "Backup"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: components.VeleroNamespace},
		Spec:       velerov1.BackupSpec{IncludedNamespaces: []string{ref.Namespace()}},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseCompleted, StartTimestamp: &metav1.Time{Time: started},
			CompletionTimestamp: &metav1.Time{Time: started.Add(time.Minute)}, Expiration: &metav1.Time{Time: now.Add(30 * 24 * time.Hour)}}}
	if edit != nil {
		edit(b)
	}
	created := f.create(t, b, "backups")
	claim, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, dataClaim(ref), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvb := &velerov1.PodVolumeBackup{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "PodVolumeBackup"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-data", Namespace: components.VeleroNamespace,
			Labels:      map[string]string{velerov1.BackupNameLabel: name, velerov1.BackupUIDLabel: string(created), velerov1.PVCUIDLabel: string(claim.UID)},
			Annotations: map[string]string{"velero.io/pvc-name": claim.Name}},
		Spec:   velerov1.PodVolumeBackupSpec{Volume: "data", Pod: corev1.ObjectReference{Kind: "Pod", Namespace: ref.Namespace(), Name: ref.Name + "-0"}},
		Status: velerov1.PodVolumeBackupStatus{Phase: velerov1.PodVolumeBackupPhaseCompleted}}
	f.create(t, pvb, "podvolumebackups")
}

// create makes a Velero object with its status, and returns its UID.
func (f *fixture) create(t *testing.T, obj runtime.Object, resource string) types.UID {
	t.Helper()
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: raw}
	gvr := velerov1.SchemeGroupVersion.WithResource(resource)
	api := f.cl.Dynamic.Resource(gvr).Namespace(components.VeleroNamespace)
	created, err := api.Create(t.Context(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if status, ok := raw["status"]; ok && created.Object["status"] == nil {
		created.Object["status"] = status
		if _, err := api.UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	name := created.GetName()
	t.Cleanup(func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return created.GetUID()
}

// copyOf reads the copies at now and returns ref's.
func (f *fixture) copyOf(t *testing.T, rec cluster.Record, ref service.Ref) prune.Kept {
	t.Helper()
	copies, err := prune.Read(t.Context(), f.cl, rec, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range copies {
		if c.Volume == oldVolume(ref) {
			return c
		}
	}
	t.Fatalf("no kept copy of %s among %+v", ref, copies)
	return prune.Kept{}
}

func conditions(c prune.Kept) []string {
	var out []string
	for _, h := range c.Holds {
		out = append(out, h.Condition)
	}
	return out
}

// wantHolds checks that exactly the conditions want hold c back, each reason containing its text.
func wantHolds(t *testing.T, c prune.Kept, want map[string]string) {
	t.Helper()
	if len(c.Holds) != len(want) {
		t.Errorf("%s: holds %+v, want %v", c.What(), c.Holds, want)
	}
	for _, h := range c.Holds {
		text, ok := want[h.Condition]
		if !ok || !strings.Contains(h.Reason, text) {
			t.Errorf("%s: hold %s %q, want %q", c.What(), h.Condition, h.Reason, text)
		}
	}
}

// healthy is a service whose every condition holds on a cluster without backups: moved two days
// ago, Ready for two hours, its one copy current.
func healthy(project, name string) moved {
	return moved{ref: service.Ref{Project: project, Environment: "prod", Name: name},
		movedAt: now.Add(-48 * time.Hour), readyAt: now.Add(-2 * time.Hour)}
}

// TestEachConditionHoldsACopyBack: each of prune's conditions alone keeps a copy, with the reason
// and time kip status shows, and only the waiver the spec gives lifts it.
func TestEachConditionHoldsACopyBack(t *testing.T) {
	f := setup(t)
	rec := f.record(t, cluster.BackupsNone)

	all := healthy("pa", "db")
	f.service(t, all)

	young := healthy("pb", "db")
	young.readyAt = now.Add(-23 * time.Minute)
	f.service(t, young)

	crashed := healthy("pc", "db")
	crashed.startedAt = now.Add(-10 * time.Minute) // Ready since two hours, its container restarted 10 min ago
	f.service(t, crashed)

	down := healthy("pd", "db")
	down.notReady = true
	f.service(t, down)

	recent := healthy("pe", "db")
	recent.movedAt = now.Add(-2 * time.Hour)
	f.service(t, recent)

	rebuilding := healthy("pf", "db")
	rebuilding.replicas, rebuilding.healthy = 2, 1
	f.service(t, rebuilding)

	unfinished := healthy("pg", "db")
	unfinished.moveUnfinished = true
	f.service(t, unfinished)

	c := f.copyOf(t, rec, all.ref)
	wantHolds(t, c, nil)
	if !c.Deletable(prune.Waivers{}) || c.Kind != prune.KindMoved || c.Service == nil || *c.Service != all.ref || c.MovedTo != newVolume(all.ref) {
		t.Errorf("copy with every condition met: %+v", c)
	}

	c = f.copyOf(t, rec, young.ref)
	wantHolds(t, c, map[string]string{prune.CondReady: "pod db-0 has been Ready for 23 min of 1 h"})
	if until := c.Holds[0].Until; until == nil || !until.Equal(young.readyAt.Add(time.Hour)) {
		t.Errorf("ready hold until %v, want %v", until, young.readyAt.Add(time.Hour))
	}
	if c.Deletable(prune.Waivers{Now: true}) || !c.Deletable(prune.Waivers{Unproven: true}) {
		t.Error("the health check must be waived by --delete-unproven only")
	}

	// The crash restarts the hour although the pod's Ready condition says two hours.
	c = f.copyOf(t, rec, crashed.ref)
	wantHolds(t, c, map[string]string{prune.CondReady: "has been Ready for 10 min of 1 h"})

	c = f.copyOf(t, rec, down.ref)
	wantHolds(t, c, map[string]string{prune.CondReady: "pod db-0 is not Ready"})

	c = f.copyOf(t, rec, recent.ref)
	wantHolds(t, c, map[string]string{prune.CondBackup: "this cluster has no backups: waiting a day after the move, until " +
		recent.movedAt.Add(24*time.Hour).Local().Format("2006-01-02 15:04")})
	if !c.Deletable(prune.Waivers{Now: true}) || c.Deletable(prune.Waivers{Unproven: true}) {
		t.Error("the wait for a backup or a day must be waived by --now only")
	}

	c = f.copyOf(t, rec, rebuilding.ref)
	wantHolds(t, c, map[string]string{prune.CondCopies: "Longhorn is changing the copies of volume " + newVolume(rebuilding.ref) + ": 1 of 2 healthy"})
	if c.Deletable(prune.Waivers{Now: true, Unproven: true}) {
		t.Error("a copy count change must hold the copy back with --now and --delete-unproven too")
	}

	c = f.copyOf(t, rec, unfinished.ref)
	wantHolds(t, c, map[string]string{prune.CondMoved: "its move to Longhorn is not finished: 'kip service storage longhorn db --project pg --environment prod'"})
}

// TestBackupsThatCount: on a cluster with backups, only a completed backup made after the move
// that holds the service's claim as bound now lets a copy go before the day is over; a Postgres
// service with consistent backups waits the day anyway.
func TestBackupsThatCount(t *testing.T) {
	f := setup(t)
	rec := f.record(t, cluster.BackupsInCluster)
	for _, tc := range []struct {
		project string
		typ     string
		backup  func(t *testing.T, ref service.Ref, movedAt time.Time)
		want    string // "" when the backup lets the copy go
	}{
		{"ba", "", func(t *testing.T, ref service.Ref, movedAt time.Time) {
			f.backup(t, "ba-after", ref, movedAt.Add(10*time.Minute), nil)
		}, ""},
		{"bb", "", func(t *testing.T, ref service.Ref, movedAt time.Time) {
			f.backup(t, "bb-before", ref, movedAt.Add(-10*time.Minute), nil)
		}, "waiting for a completed backup made after the move"},
		{"bc", "", func(t *testing.T, ref service.Ref, movedAt time.Time) {
			f.backup(t, "bc-expired", ref, movedAt.Add(10*time.Minute), func(b *velerov1.Backup) {
				b.Status.Expiration = &metav1.Time{Time: now.Add(-time.Minute)}
			})
		}, "waiting for a completed backup made after the move"},
		{"bd", "", func(t *testing.T, ref service.Ref, movedAt time.Time) {
			f.backup(t, "bd-deleting", ref, movedAt.Add(10*time.Minute), nil)
			dbr := &velerov1.DeleteBackupRequest{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "DeleteBackupRequest"},
				ObjectMeta: metav1.ObjectMeta{Name: "bd-deleting-delete", Namespace: components.VeleroNamespace},
				Spec:       velerov1.DeleteBackupRequestSpec{BackupName: "bd-deleting"}}
			f.create(t, dbr, "deletebackuprequests")
		}, "waiting for a completed backup made after the move"},
		{"be", "", func(t *testing.T, ref service.Ref, movedAt time.Time) {}, "waiting for a completed backup made after the move ('kip backup create'), or until"},
		{"bf", "postgres", func(t *testing.T, ref service.Ref, movedAt time.Time) {
			f.backup(t, "bf-after", ref, movedAt.Add(10*time.Minute), nil)
		},
			"a postgres service with consistent backups waits a day after the move"},
	} {
		t.Run(tc.project, func(t *testing.T) {
			m := healthy(tc.project, "db")
			m.typ = tc.typ
			m.movedAt = now.Add(-3 * time.Hour)
			f.service(t, m)
			tc.backup(t, m.ref, m.movedAt)
			c := f.copyOf(t, rec, m.ref)
			if tc.want == "" {
				wantHolds(t, c, nil)
				return
			}
			wantHolds(t, c, map[string]string{prune.CondBackup: tc.want})
		})
	}
}

// TestOrphansAndReplacedVolumes: a copy whose service and claim are gone goes without checks; one
// whose service lost or replaced the Longhorn volume stays, whatever is waived.
func TestOrphansAndReplacedVolumes(t *testing.T) {
	f := setup(t)
	rec := f.record(t, cluster.BackupsNone)
	ctx := t.Context()

	orphan := healthy("oa", "db")
	orphan.movedAt = now.Add(-time.Minute) // a recent move: the checks would hold it
	f.service(t, orphan)
	if err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(orphan.ref.Namespace()).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.deletePod(t, orphan.ref)
	if err := f.cl.Kube.CoreV1().PersistentVolumeClaims(orphan.ref.Namespace()).Delete(ctx, dataClaim(orphan.ref), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error {
		_, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(orphan.ref.Namespace()).Get(ctx, dataClaim(orphan.ref), metav1.GetOptions{})
		return err
	})
	c := f.copyOf(t, rec, orphan.ref)
	if c.Kind != prune.KindOrphan || !c.Deletable(prune.Waivers{}) || c.Service != nil {
		t.Errorf("orphan copy: %+v", c)
	}

	replaced := healthy("ob", "db")
	f.service(t, replaced)
	// The service's claim now names another volume: a restore, or an admin's hand.
	f.deletePod(t, replaced.ref)
	if err := f.cl.Kube.CoreV1().PersistentVolumeClaims(replaced.ref.Namespace()).Delete(ctx, dataClaim(replaced.ref), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error {
		_, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(replaced.ref.Namespace()).Get(ctx, dataClaim(replaced.ref), metav1.GetOptions{})
		return err
	})
	c = f.copyOf(t, rec, replaced.ref)
	wantHolds(t, c, map[string]string{prune.CondReplaced: "service db in ob-prod has no data claim data-db-0 any more: this copy may hold the only original data"})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: dataClaim(replaced.ref), Namespace: replaced.ref.Namespace()}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(move.Class), VolumeName: "pvc-restored",
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(replaced.ref.Namespace()).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c = f.copyOf(t, rec, replaced.ref)
	wantHolds(t, c, map[string]string{prune.CondReplaced: "names volume pvc-restored, not Longhorn volume " + newVolume(replaced.ref) + " the move verified"})
	if c.Deletable(prune.Waivers{Now: true, Unproven: true}) {
		t.Error("a copy whose service replaced its volume must be kept whatever is waived")
	}
}

// deletePod deletes the service's pod at once: no kubelet runs on its node to end it.
func (f *fixture) deletePod(t *testing.T, ref service.Ref) {
	t.Helper()
	if err := f.cl.Kube.CoreV1().Pods(ref.Namespace()).Delete(t.Context(), ref.Name+"-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
}

func waitGone(t *testing.T, get func() error) {
	t.Helper()
	if err := kube.Poll(t.Context(), time.Minute, "the object to go", func(context.Context) (bool, string, error) {
		err := get()
		return apierrors.IsNotFound(err), "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// removed plays the server's storage directory: it records what prune deleted there, in order,
// and runs a hook for each; every other directory is present, and so is each one in unreachable
// (its deletion fails as when SSH does not connect).
type removed struct {
	dirs        []string
	hook        func(dir string)
	unreachable bool
}

func (r *removed) remove(_ context.Context, host, dir string) error {
	if host != "192.0.2.10" {
		return fmt.Errorf("remove on host %s, want the record's server", host)
	}
	if r.unreachable {
		return errors.New("ssh: connect to host 192.0.2.10 port 22: connection refused")
	}
	r.dirs = append(r.dirs, dir)
	if r.hook != nil {
		r.hook(dir)
	}
	return nil
}

func (r *removed) present(_ context.Context, host, dir string) (bool, error) {
	if host != "192.0.2.10" {
		return false, fmt.Errorf("look on host %s, want the record's server", host)
	}
	return !slices.Contains(r.dirs, dir), nil
}

func (f *fixture) options(t *testing.T, rm *removed, out *bytes.Buffer) *prune.Options {
	ios := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: out, Getenv: func(string) string { return "" }}
	return &prune.Options{Kube: func() (*kube.Clients, error) { return f.cl, nil }, Printer: cli.NewPrinter(ios),
		Prompter: cli.NewPrompter(ios, true), Holder: "kip cluster storage prune (test)", KipVersion: "v0.0.0-test",
		Remove: rm.remove, Present: rm.present, Clock: func() time.Time { return now }}
}

// TestPruneDeletesWhatMayGo runs the prune: it deletes the copy whose conditions hold and the
// orphan, keeps the rest with why, and a condition that turns false between the listing and the
// delete stops that delete. Named, --delete-unproven waives the health check for that copy only.
func TestPruneDeletesWhatMayGo(t *testing.T) {
	f := setup(t)
	f.record(t, cluster.BackupsNone)
	ctx := t.Context()
	ok := healthy("ra", "db")
	f.service(t, ok)
	turns := healthy("rb", "db")
	f.service(t, turns)
	young := healthy("rc", "db")
	young.readyAt = now.Add(-5 * time.Minute)
	f.service(t, young)
	stopped := healthy("rd", "db")
	stopped.readyAt = now.Add(-5 * time.Minute)
	f.service(t, stopped)

	var out bytes.Buffer
	rm := &removed{}
	// While the first copy is deleted, the next one's pod crashes and restarts.
	rm.hook = func(dir string) {
		if !strings.Contains(dir, oldVolume(ok.ref)) {
			return
		}
		p, err := f.cl.Kube.CoreV1().Pods(turns.ref.Namespace()).Get(ctx, "db-0", metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		m := turns
		m.startedAt = now.Add(-time.Minute)
		f.setPod(t, p, m)
	}
	err := prune.Run(ctx, f.options(t, rm, &out))
	if err == nil || !strings.Contains(err.Error(), "kept 1 copy whose conditions changed since the listing: db in rb-prod: pod db-0 has been Ready for 1 min of 1 h") {
		t.Errorf("prune: %v, want the copy whose pod restarted kept\n%s", err, out.String())
	}
	if !slices.Equal(rm.dirs, []string{cluster.LocalStorageDir + "/" + oldVolume(ok.ref) + "_ra-prod_data-db-0"}) {
		t.Errorf("removed %v", rm.dirs)
	}
	for _, ref := range []service.Ref{ok.ref} {
		if err := deleted(ctx, f, oldVolume(ref)); err != nil {
			t.Errorf("volume %s after the prune: %v", oldVolume(ref), err)
		}
	}
	for _, ref := range []service.Ref{turns.ref, young.ref, stopped.ref} {
		pv, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, oldVolume(ref), metav1.GetOptions{})
		if err != nil || pv.Annotations[prune.StartedAnnotation] != "" {
			t.Errorf("kept volume %s: %v %v", oldVolume(ref), err, pv.Annotations)
		}
	}
	for _, s := range []string{"To delete, every condition met:", "db in ra-prod: volume " + oldVolume(ok.ref), "Kept:",
		"db in rc-prod", "pod db-0 has been Ready for 5 min of 1 h", "Deleted the local copy of db in ra-prod"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}

	// Named with --delete-unproven: only that copy, without the health check.
	out.Reset()
	rm.dirs, rm.hook = nil, nil
	o := f.options(t, rm, &out)
	o.Name, o.Project, o.Unproven = "db", "rc", true
	if err := prune.Run(ctx, o); err != nil {
		t.Fatalf("prune db --project rc --delete-unproven: %v\n%s", err, out.String())
	}
	if len(rm.dirs) != 1 || !strings.Contains(rm.dirs[0], oldVolume(young.ref)) {
		t.Errorf("removed %v, want only %s", rm.dirs, oldVolume(young.ref))
	}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, oldVolume(stopped.ref), metav1.GetOptions{}); err != nil {
		t.Errorf("the copy of another service went with --delete-unproven: %v", err)
	}

	// Refusals of flags that do not go together.
	for _, tc := range []struct {
		edit func(*prune.Options)
		want string
	}{
		{func(o *prune.Options) { o.Unproven = true }, "--delete-unproven waives the health check for one copy only"},
		{func(o *prune.Options) { o.Name = "db" }, "name the project of service db with --project"},
		{func(o *prune.Options) { o.Project = "rd" }, "name the service too"},
		{func(o *prune.Options) { o.Name, o.Project = "nosuch", "rd" }, "no local copy of service nosuch in project rd is kept"},
	} {
		o := f.options(t, &removed{}, &bytes.Buffer{})
		tc.edit(o)
		if err := prune.Run(ctx, o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("prune %+v: %v, want %q", o, err, tc.want)
		}
	}
}

// TestInterruptedDeleteIsFinished: a copy a prune marked and did not finish is finished by the
// next prune without its checks once its directory's deletion began on the server (gone from its
// path); while the directory is there, the mark decides nothing. A prune whose SSH does not
// connect leaves the copy marked with its directory whole: a later prune keeps it once its
// service has replaced its volume, since it may hold the only original data.
func TestInterruptedDeleteIsFinished(t *testing.T) {
	f := setup(t)
	rec := f.record(t, cluster.BackupsNone)
	ctx := t.Context()
	m := healthy("ia", "db")
	m.readyAt = now.Add(-time.Minute) // the health check would hold it
	f.service(t, m)
	patch := []byte(`{"metadata":{"annotations":{"` + prune.StartedAnnotation + `":"2026-12-02T11:00:00Z"}}}`)
	if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Patch(ctx, oldVolume(m.ref), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := f.copyOf(t, rec, m.ref).Path

	// Its directory whole on the server: judged as any copy, kept by the health check.
	var out bytes.Buffer
	rm := &removed{}
	if err := prune.Run(ctx, f.options(t, rm, &out)); err != nil || len(rm.dirs) != 0 || !strings.Contains(out.String(), "pod db-0 has been Ready for 1 min of 1 h") {
		t.Fatalf("prune of a marked copy whose directory is whole: %v, removed %v\n%s", err, rm.dirs, out.String())
	}

	// Gone from its path (the deletion began): finished without checks.
	out.Reset()
	rm.dirs = []string{dir}
	if err := prune.Run(ctx, f.options(t, rm, &out)); err != nil {
		t.Fatalf("prune: %v\n%s", err, out.String())
	}
	if !slices.Equal(rm.dirs, []string{dir, dir}) || !strings.Contains(out.String(), "To finish deleting, an earlier prune started and was interrupted:") {
		t.Errorf("removed %v\n%s", rm.dirs, out.String())
	}
	if err := deleted(ctx, f, oldVolume(m.ref)); err != nil {
		t.Errorf("volume after the prune: %v", err)
	}

	// SSH does not connect: the prune fails with the copy marked and its directory whole.
	cut := healthy("ib", "db")
	f.service(t, cut)
	out.Reset()
	rm = &removed{unreachable: true}
	o := f.options(t, rm, &out)
	o.Now = true
	if err := prune.Run(ctx, o); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("prune with SSH refused: %v\n%s", err, out.String())
	}
	pv, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, oldVolume(cut.ref), metav1.GetOptions{})
	if err != nil || pv.Annotations[prune.StartedAnnotation] == "" {
		t.Fatalf("the copy after a prune whose SSH failed: %v %v", err, pv)
	}
	// Its service's claim then names another volume (a restore): the copy may hold the only
	// original data, and the next prune keeps it.
	f.deletePod(t, cut.ref)
	claims := f.cl.Kube.CoreV1().PersistentVolumeClaims(cut.ref.Namespace())
	if err := claims.Delete(ctx, dataClaim(cut.ref), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error { _, err := claims.Get(ctx, dataClaim(cut.ref), metav1.GetOptions{}); return err })
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: dataClaim(cut.ref), Namespace: cut.ref.Namespace()}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(move.Class), VolumeName: "pvc-restored",
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := claims.Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	rm = &removed{}
	o = f.options(t, rm, &out)
	o.Now = true
	if err := prune.Run(ctx, o); err != nil || len(rm.dirs) != 0 || !strings.Contains(out.String(), "names volume pvc-restored, not Longhorn volume "+newVolume(cut.ref)) {
		t.Errorf("prune of a marked copy whose service replaced its volume: %v, removed %v\n%s", err, rm.dirs, out.String())
	}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, oldVolume(cut.ref), metav1.GetOptions{}); err != nil {
		t.Errorf("the copy whose service replaced its volume: %v", err)
	}
}

// deleted checks that the PersistentVolume is deleted: gone, or being deleted while Kubernetes'
// controller lifts its protection finalizer, which it does on its own time.
func deleted(ctx context.Context, f *fixture, name string) error {
	pv, err := f.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case pv.DeletionTimestamp == nil:
		return errors.New("not deleted")
	}
	return nil
}
