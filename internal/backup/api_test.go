package backup_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/testenv"
	velerotest "kipper.run/kip/test/velero"
)

// TestMain shares one API test environment among this package's tests; each test that needs
// Velero starts the real Velero server against it (velerotest.Start).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

var (
	projectsGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "projects"}
	backupsGVR  = velerov1.SchemeGroupVersion.WithResource("backups")
	dbrsGVR     = velerov1.SchemeGroupVersion.WithResource("deletebackuprequests")
)

// fixture is a test's cluster: the environment, kip's clients, Velero, and what kip printed.
type fixture struct {
	env    *testenv.Env
	cl     *kube.Clients
	velero *velerotest.Server
	out    *bytes.Buffer
	errOut *bytes.Buffer
	p      *cli.Printer
	node   string // the kwok Node pods run on
}

func newFixture(t *testing.T, profile string, backups string) *fixture {
	t.Helper()
	env := testenv.Get(t)
	env.StartKwok(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{env: env, cl: cl, out: &bytes.Buffer{}, errOut: &bytes.Buffer{}}
	f.p = cli.NewPrinter(&cli.IOStreams{Out: f.out, ErrOut: f.errOut, Getenv: func(string) string { return "" }})
	f.record(t, profile, backups)
	if backups != cluster.BackupsNone {
		f.velero = velerotest.Start(t, env)
	}
	f.node = "node-" + env.Namespace(t)
	env.AddNode(t, f.node, testenv.NodeOptions{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kip printed:\n%s%s", f.errOut, f.out)
		}
	})
	return f
}

func (f *fixture) record(t *testing.T, profile, backups string) {
	t.Helper()
	if _, err := cluster.UpdateRecord(context.Background(), f.cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Backups = profile, cluster.StorageLocal, backups
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) options() backup.Options {
	return backup.Options{Kube: func() (*kube.Clients, error) { return f.cl, nil }, Printer: f.p, Out: f.out}
}

// project creates a Kipper Project listing namespaces as its environments' namespaces, as the
// console's controller does.
func (f *fixture) project(t *testing.T, name string, namespaces ...string) {
	t.Helper()
	ctx := context.Background()
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{}}}
	created, err := f.cl.Dynamic.Resource(projectsGVR).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cl.Dynamic.Resource(projectsGVR).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	ns := make([]any, len(namespaces))
	for i, n := range namespaces {
		ns[i] = n
	}
	if err := unstructured.SetNestedSlice(created.Object, ns, "status", "namespaces"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Dynamic.Resource(projectsGVR).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// service puts a small service in ns: a ConfigMap and a Deployment whose pod (kwok's) runs.
func (f *fixture) service(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-config", Namespace: ns}, Data: map[string]string{"greeting": "hello from " + ns}}
	if _, err := f.cl.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: testenv.FastPodAnnotations()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "registry.example/" + name + ":1"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}}}
	if _, err := f.cl.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitRollout(ctx, f.cl, "Deployment", ns, name, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// boundClaim creates a claim bound to a local volume on the fixture's node, as the local-path
// provisioner binds one, and waits until the controller-manager has bound them.
func (f *fixture) boundClaim(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + ns + "-" + name}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		StorageClassName:              "local-path",
		PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/var/lib/rancher/k3s/storage/" + name}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{f.node}}}}}}},
		ClaimRef: &corev1.ObjectReference{Namespace: ns, Name: name}}}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.cl.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To("local-path"), VolumeName: pv.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "claim "+name+" bound", func(ctx context.Context) (bool, string, error) {
		got, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, "not bound yet", err
	}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) readBackup(t *testing.T, name string) *velerov1.Backup {
	t.Helper()
	b, err := kube.GetAs[velerov1.Backup](context.Background(), f.cl.Dynamic, backupsGVR, velerotest.Namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lastBackup is the backup kip created last (kip names it in its output).
func (f *fixture) lastBackup(t *testing.T) string {
	t.Helper()
	const started = "Started backup "
	i := strings.LastIndex(f.errOut.String(), started)
	if i < 0 {
		t.Fatalf("kip named no backup:\n%s", f.errOut)
	}
	name, _, _ := strings.Cut(f.errOut.String()[i+len(started):], " ")
	return name
}

func describe(t *testing.T, f *fixture, name string) backup.Description {
	t.Helper()
	f.out.Reset()
	o := &backup.DescribeOptions{Options: f.options(), Name: name}
	o.JSON = true
	if err := backup.Describe(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var d backup.Description
	if err := json.Unmarshal(f.out.Bytes(), &d); err != nil {
		t.Fatalf("describe -o json: %v\n%s", err, f.out)
	}
	return d
}

// testCreateWaitRestore backs a project of three namespaces up with the real Velero server, finds
// the backup in the bucket and restores one namespace beside the original. Over the original,
// where one of its two services was deleted since (as kip service delete does) and the other
// changed, a restore off a terminal without --yes is refused, naming what it would skip; with
// --yes it brings the deleted service back and leaves the other as it is.
func testCreateWaitRestore(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	var namespaces []string
	for i := 0; i < 3; i++ {
		ns := f.env.Namespace(t)
		f.service(t, ns, fmt.Sprintf("web%d", i))
		namespaces = append(namespaces, ns)
	}
	f.project(t, "shop", namespaces...)
	src := namespaces[0] // web0's, and kept's
	f.service(t, src, "kept")

	start := time.Now()
	_, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Project: "shop", Wait: true, Holder: "kip backup create --project shop --wait"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: kip backup create --project shop --wait, a project of 3 namespaces, took %s", time.Since(start).Round(time.Millisecond))
	name := f.lastBackup(t)
	if !strings.HasPrefix(name, "shop-") {
		t.Errorf("backup %s is not named after its project", name)
	}
	b := f.readBackup(t, name)
	slices.Sort(namespaces)
	if !slices.Equal(b.Spec.IncludedNamespaces, namespaces) || b.Labels[backup.ProjectLabel] != "shop" || b.Spec.TTL.Duration != backup.DefaultTTL {
		t.Errorf("backup spec %+v labels %v: want the project's namespaces %v and a 720h TTL", b.Spec, b.Labels, namespaces)
	}
	if objs := f.velero.Objects(t, "backups/"+name+"/"); !slices.Contains(objs, "backups/"+name+"/"+name+".tar.gz") {
		t.Fatalf("the bucket holds %v under backups/%s/, not the backup's tarball", objs, name)
	}
	d := describe(t, f, name)
	if d.Verdict.State != backup.StateCompleted || d.Phase != "Completed" || d.TotalItems == 0 || len(d.ByNamespace) != 3 {
		t.Errorf("describe: %+v", d)
	}

	// Restored beside the original, the objects come back.
	dst := src + "-restored"
	t.Cleanup(func() { f.cl.Kube.CoreV1().Namespaces().Delete(context.Background(), dst, metav1.DeleteOptions{}) })
	err = backup.Restore(ctx, &backup.RestoreOptions{Options: f.options(), Name: name, Namespaces: []string{src}, Mapping: map[string]string{src: dst}})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := f.cl.Kube.CoreV1().ConfigMaps(dst).Get(ctx, "web0-config", metav1.GetOptions{})
	if err != nil || cm.Data["greeting"] != "hello from "+src {
		t.Fatalf("restored ConfigMap %v, %v", cm, err)
	}
	if _, err := f.cl.Kube.AppsV1().Deployments(dst).Get(ctx, "web0", metav1.GetOptions{}); err != nil {
		t.Errorf("restored Deployment: %v", err)
	}

	// Over the original, web0 deleted and kept changed since the backup: what exists is skipped,
	// so off a terminal without --yes the restore is refused, naming it.
	if err := f.cl.Kube.AppsV1().Deployments(src).Delete(ctx, "web0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.cl.Kube.CoreV1().ConfigMaps(src).Delete(ctx, "web0-config", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := `{"data":{"greeting":"changed after the backup"}}`
	if _, err := f.cl.Kube.CoreV1().ConfigMaps(src).Patch(ctx, "kept-config", types.MergePatchType, []byte(changed), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	prompter := func(yes bool) *cli.Prompter {
		return cli.NewPrompter(&cli.IOStreams{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard}, yes)
	}
	err = backup.Restore(ctx, &backup.RestoreOptions{Options: f.options(), Name: name, Namespaces: []string{src}, Prompter: prompter(false)})
	if err == nil || !strings.Contains(err.Error(), "namespace "+src+" still holds objects that restoring "+name+" skips") ||
		!strings.Contains(err.Error(), "deployment kept") || !strings.Contains(err.Error(), "configmap kept-config") || strings.Contains(err.Error(), "web0") ||
		!strings.Contains(err.Error(), "run the same command with --yes") || !strings.Contains(err.Error(), "--namespace-mapping <namespace>:"+src+"-restored") {
		t.Errorf("restore over the original without --yes: %v", err)
	}
	if _, err := f.cl.Kube.AppsV1().Deployments(src).Get(ctx, "web0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused restore brought Deployment web0 back: %v", err)
	}
	// With --yes: web0 is back as it was backed up, kept stays as it is now.
	if err := backup.Restore(ctx, &backup.RestoreOptions{Options: f.options(), Name: name, Namespaces: []string{src}, Prompter: prompter(true)}); err != nil {
		t.Fatal(err)
	}
	if cm, err := f.cl.Kube.CoreV1().ConfigMaps(src).Get(ctx, "web0-config", metav1.GetOptions{}); err != nil || cm.Data["greeting"] != "hello from "+src {
		t.Errorf("web0's ConfigMap after the restore with --yes: %v, %v", cm, err)
	}
	if _, err := f.cl.Kube.AppsV1().Deployments(src).Get(ctx, "web0", metav1.GetOptions{}); err != nil {
		t.Errorf("web0's Deployment after the restore with --yes: %v", err)
	}
	if cm, err := f.cl.Kube.CoreV1().ConfigMaps(src).Get(ctx, "kept-config", metav1.GetOptions{}); err != nil || cm.Data["greeting"] != "changed after the backup" {
		t.Errorf("kept's ConfigMap after the restore with --yes: %v, %v; want it left as it was", cm, err)
	}
}

// testPodNotRunningIsNotACompletedBackup: Velero skips the volumes of a pod that is not Running
// and calls the backup Completed with no errors; kip does not.
func testPodNotRunningIsNotACompletedBackup(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	ns := f.env.Namespace(t)
	f.boundClaim(t, ns, "data-db-0")
	f.boundClaim(t, ns, "data-stopped-0") // a stopped service's: no pod mounts it
	// A pod that cannot be scheduled stays Pending.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: ns}, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{"kipper.run/no-such-node": "true"},
		Containers:   []corev1.Container{{Name: "db", Image: "postgres:17", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql"}}}},
		Volumes:      []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}}}
	if _, err := f.cl.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{ns}, Wait: true})
	for _, want := range []string{"it holds no data for volume " + ns + "/data-db-0", "it holds no data for volume " + ns + "/data-stopped-0"} {
		if err == nil || !strings.Contains(err.Error(), "is not a completed backup") || !strings.Contains(err.Error(), want) {
			t.Fatalf("create --wait = %v, want a refusal containing %q", err, want)
		}
	}
	for _, warning := range []string{"pod " + ns + "/db-0 (Pending) mounts claim data-db-0", "no running pod mounts claim " + ns + "/data-stopped-0"} {
		if !strings.Contains(f.errOut.String(), warning) {
			t.Errorf("kip did not warn before the backup: %q\n%s", warning, f.errOut)
		}
	}
	b := f.readBackup(t, f.lastBackup(t))
	if b.Status.Phase != velerov1.BackupPhaseCompleted || b.Status.Errors != 0 {
		t.Fatalf("Velero's verdict: phase %s, %d errors; this test needs Velero to call it Completed with no errors", b.Status.Phase, b.Status.Errors)
	}
	t.Logf("Velero: phase %s, %d errors, %d warnings; kip: %v", b.Status.Phase, b.Status.Errors, b.Status.Warnings, err)
	if d := describe(t, f, b.Name); d.Verdict.State != backup.StateNotCompleted || len(d.ByNamespace) != 1 || !slices.Equal(d.ByNamespace[0].Missing, []string{"data-db-0", "data-stopped-0"}) {
		t.Errorf("describe: %+v", d)
	}
}

// testExpiredAndBeingDeleted: a finished backup past its expiry (Velero's GC runs hourly, so the
// object stays) and one with a DeleteBackupRequest not yet processed are not completed backups.
func testExpiredAndBeingDeleted(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	ns := f.env.Namespace(t)
	f.service(t, ns, "web")
	if _, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{ns}, Wait: true, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	name := f.lastBackup(t)
	b := f.readBackup(t, name)

	// Expired: kip's clock an hour and a minute on.
	later := f.options()
	later.Now = func() time.Time { return b.Status.Expiration.Add(time.Minute) }
	later.JSON = true
	f.out.Reset()
	if err := backup.List(ctx, &backup.ListOptions{Options: later}); err != nil {
		t.Fatal(err)
	}
	var list []backup.Summary
	if err := json.Unmarshal(f.out.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(s backup.Summary) bool { return s.Name == name })
	if i < 0 || list[i].Verdict.State != backup.StateNotCompleted || !strings.Contains(strings.Join(list[i].Verdict.Reasons, ";"), "it expired at") || list[i].Phase != "Completed" {
		t.Fatalf("list after expiry: %+v", list)
	}

	// Being deleted: Velero is stopped so that the request stays New, as it is until Velero
	// takes it up.
	f.velero.Stop(t)
	req := &velerov1.DeleteBackupRequest{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "DeleteBackupRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-delete", Namespace: velerotest.Namespace,
			Labels: map[string]string{velerov1.BackupNameLabel: name, velerov1.BackupUIDLabel: string(b.UID)}},
		Spec: velerov1.DeleteBackupRequestSpec{BackupName: name}}
	if _, err := kube.CreateAs(ctx, f.cl.Dynamic, dbrsGVR, velerotest.Namespace, req); err != nil {
		t.Fatal(err)
	}
	d := describe(t, f, name)
	if d.Verdict.State != backup.StateNotCompleted || d.Deletion == nil || d.Deletion.Phase != "New" ||
		!strings.Contains(strings.Join(d.Verdict.Reasons, ";"), "it is being deleted (DeleteBackupRequest "+name+"-delete, New)") {
		t.Errorf("describe while a deletion is requested: %+v", d)
	}
	err := backup.Drill(ctx, &backup.DrillOptions{Options: f.options(), Namespace: ns})
	if err == nil || !strings.Contains(err.Error(), "no completed backup holds "+ns) || !strings.Contains(err.Error(), "being deleted") {
		t.Errorf("drill from a backup being deleted: %v", err)
	}
	f.velero.Resume(t)
}

// testDrill restores a namespace's latest completed backup beside it, waits for its workloads and
// removes the copy; on nano it is refused.
func testDrill(t *testing.T, f *fixture) {
	f.record(t, cluster.ProfileNano, cluster.BackupsExternal)
	ctx := context.Background()
	ns := f.env.Namespace(t)
	f.service(t, ns, "web")
	if err := backup.Drill(ctx, &backup.DrillOptions{Options: f.options(), Namespace: ns}); !errors.Is(err, backup.ErrDrillOnNano) {
		t.Fatalf("drill on nano = %v", err)
	}
	if !strings.Contains(backup.ErrDrillOnNano.Error(), "kip service restore-dump") {
		t.Errorf("the nano refusal names no alternative: %v", backup.ErrDrillOnNano)
	}

	f.record(t, "small", cluster.BackupsExternal)
	want := "no backup holds " + ns + ": back it up with 'kip backup create --namespace " + ns + " --wait' first"
	if err := backup.Drill(ctx, &backup.DrillOptions{Options: f.options(), Namespace: ns}); err == nil || err.Error() != want {
		t.Errorf("drill without a backup = %v, want %q", err, want)
	}
	if _, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{ns}, Wait: true}); err != nil {
		t.Fatal(err)
	}
	o := &backup.DrillOptions{Options: f.options(), Namespace: ns}
	o.JSON = true
	f.out.Reset()
	if err := backup.Drill(ctx, o); err != nil {
		t.Fatal(err)
	}
	var rep backup.DrillReport
	if err := json.Unmarshal(f.out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Copy != ns+"-drill" || !slices.Equal(rep.Ready, []string{"deployment web"}) || !rep.Removed {
		t.Errorf("drill report %+v", rep)
	}
	if _, err := f.cl.Kube.CoreV1().Namespaces().Get(ctx, rep.Copy, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the copy %s is still there: %v", rep.Copy, err)
	}
}

// TestVelero runs kip backup against one real Velero server (started once: each start waits for
// the previous one's namespace to go).
func TestVelero(t *testing.T) {
	f := newFixture(t, "small", cluster.BackupsExternal)
	for _, tt := range []struct {
		name string
		run  func(*testing.T, *fixture)
	}{
		{"CreateWaitRestore", testCreateWaitRestore},
		{"PodNotRunningIsNotACompletedBackup", testPodNotRunningIsNotACompletedBackup},
		{"ExpiredAndBeingDeleted", testExpiredAndBeingDeleted},
		{"Drill", testDrill},
		{"RepositoryKeyExport", testRepositoryKeyExport},
		{"ListRequests", testListRequests},
		{"ExcludedCopyPodIsLeftOut", testExcludedCopyPodIsLeftOut},
		{"RestoreDumpRefusals", testRestoreDumpRefusals},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f.out.Reset()
			f.errOut.Reset()
			tt.run(t, f)
		})
	}
}

// TestNoBackups: every command on a cluster without Velero says how to add external storage.
func TestNoBackups(t *testing.T) {
	f := newFixture(t, cluster.ProfileNano, cluster.BackupsNone)
	err := backup.List(context.Background(), &backup.ListOptions{Options: f.options()})
	if !errors.Is(err, backup.ErrNoBackups) || !strings.Contains(err.Error(), "kip install --host HOST --backup-storage-bucket BUCKET") ||
		!strings.Contains(err.Error(), "resets users created in the console") {
		t.Errorf("list without backups: %v", err)
	}
	err = backup.RestoreDump(context.Background(), &backup.RestoreDumpOptions{Options: f.options(), Ref: service.Ref{Name: "db"}})
	if !errors.Is(err, backup.ErrNoBackups) {
		t.Errorf("restore-dump without backups: %v", err)
	}
}

// testRestoreDumpRefusals: kip service restore-dump refuses a service that is not Postgres, a
// Postgres service no backup holds, a backup that does not hold its namespace, and one whose
// file-system backup of the dump volume did not complete (here Velero has no node agent, as a
// cluster whose node agent is down), each saying what to do, before it writes anything.
func testRestoreDumpRefusals(t *testing.T, f *fixture) {
	f.record(t, cluster.ProfileNano, cluster.BackupsExternal)
	ctx := context.Background()
	project := f.env.Namespace(t)
	ref := service.Ref{Project: project, Environment: "prod", Name: "db"}
	ns := ref.Namespace()
	p := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": project}, "spec": map[string]any{"environments": []any{map[string]any{"name": "prod"}}}}}
	if _, err := f.cl.Dynamic.Resource(projectsGVR).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.cl.Dynamic.Resource(projectsGVR).Delete(context.Background(), project, metav1.DeleteOptions{})
	})
	if _, err := f.cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cl.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	for name, typ := range map[string]string{"db": "postgres", "cache": "redis"} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"type": typ, "storage": "1Gi"}}}
		if _, err := f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The service's pod, mounting its claims, as the console runs it.
	f.boundClaim(t, ns, "data-db-0")
	f.boundClaim(t, ns, "dump-db-0")
	claim := func(name string) corev1.Volume {
		return corev1.Volume{Name: strings.Split(name, "-")[0], VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}
	}
	labels := map[string]string{service.Label: "db"}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns}, Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, ServiceName: "db",
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: testenv.FastPodAnnotations()},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "registry.example/postgres:17",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "dump", MountPath: "/dump"}}}},
				Volumes:     []corev1.Volume{claim("data-db-0"), claim("dump-db-0")},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}}}
	if _, err := f.cl.Kube.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitRollout(ctx, f.cl, "StatefulSet", ns, "db", time.Minute); err != nil {
		t.Fatal(err)
	}
	run := func(name, from string) error {
		return backup.RestoreDump(ctx, &backup.RestoreDumpOptions{Options: f.options(), Ref: service.Ref{Name: name}, Backup: from})
	}
	for _, c := range []struct{ name, from, want string }{
		{"cache", "", "service cache in " + ns + " is a redis service: kip service restore-dump restores a Postgres service's database dump"},
		{"db", "", "no backup holds " + ns + ": back the service up with 'kip backup create --namespace " + ns + " --wait' first"},
		{"db", "no-such-backup", `no backup "no-such-backup"`},
	} {
		if err := run(c.name, c.from); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("restore-dump %s (backup %q) = %v, want %q", c.name, c.from, err, c.want)
		}
	}
	other := f.env.Namespace(t)
	f.service(t, other, "web")
	elsewhere, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{other}, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := run("db", elsewhere); err == nil || !strings.Contains(err.Error(), "backup "+elsewhere+" does not hold namespace "+ns) {
		t.Errorf("restore-dump from a backup of another namespace = %v", err)
	}
	// Velero finds no node agent for the pod's volumes: the backup holds no dump.
	held, _ := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{ns}, Wait: true})
	if held == "" {
		t.Fatal("no backup of " + ns + " was started")
	}
	err = run("db", held)
	if err == nil || !strings.Contains(err.Error(), "backup "+held+" is not a completed backup") || !strings.Contains(err.Error(), "dump-db-0") ||
		!strings.Contains(err.Error(), "name another with --backup") {
		t.Errorf("restore-dump from a backup without the dump = %v", err)
	}
	if err := run("db", ""); err == nil || !strings.Contains(err.Error(), "no completed backup holds "+ns+"; the newest, backup "+held) {
		t.Errorf("restore-dump with no completed backup of the dump = %v", err)
	}
	if _, err := f.cl.Kube.CoreV1().Namespaces().Get(ctx, ns+"-db-dump", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused restore-dump left its scratch namespace: %v", err)
	}
}

// testRepositoryKeyExport writes the key Velero created to a 0600 file and refuses to overwrite.
func testRepositoryKeyExport(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	var secret *corev1.Secret
	if err := kube.Poll(ctx, time.Minute, "Velero's repository key", func(ctx context.Context) (bool, string, error) {
		s, err := f.cl.Kube.CoreV1().Secrets(velerotest.Namespace).Get(ctx, backup.RepositoryKeySecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not created yet", nil
		}
		secret = s
		return err == nil, "", err
	}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "repository-key")
	if err := backup.ExportRepositoryKey(ctx, &backup.ExportOptions{Options: f.options(), To: file}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(file)
	if err != nil || !bytes.Equal(got, secret.Data[backup.RepositoryKeyField]) {
		t.Fatalf("exported %q, %v; want the Secret's key", got, err)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	if strings.Contains(f.errOut.String()+f.out.String(), string(got)) {
		t.Error("kip printed the key")
	}
	if err := backup.ExportRepositoryKey(ctx, &backup.ExportOptions{Options: f.options(), To: file}); err == nil || !strings.Contains(err.Error(), "never overwrites") {
		t.Errorf("second export: %v", err)
	}
	err = backup.ExportSSEKey(ctx, &backup.ExportOptions{Options: f.options(), To: filepath.Join(t.TempDir(), "sse")})
	if err == nil || !strings.Contains(err.Error(), "not encrypted with an SSE-C key") {
		t.Errorf("sse-key export without SSE-C: %v", err)
	}
}

// countingTransport counts the API requests kip makes.
type countingTransport struct {
	mu   sync.Mutex
	reqs []string
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, r.Method+" "+r.URL.Path)
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

// testListRequests: kip backup list reads 500 backups with one list request per kind.
func testListRequests(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	// Velero is stopped so that it does not run 500 backups; kip reads them as they are.
	f.velero.Stop(t)
	t.Cleanup(func() { f.velero.Resume(t) })
	const n = 500
	for i := 0; i < n; i++ {
		b := &velerov1.Backup{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "Backup"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("many-%03d", i), Namespace: velerotest.Namespace, Labels: map[string]string{"kip-test": "many"}},
			Spec:       velerov1.BackupSpec{IncludedNamespaces: []string{"shop-prod"}}}
		if _, err := kube.CreateAs(ctx, f.cl.Dynamic, backupsGVR, velerotest.Namespace, b); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		f.cl.Dynamic.Resource(backupsGVR).Namespace(velerotest.Namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "kip-test=many"})
	})
	counter := &countingTransport{}
	cfg := rest.CopyConfig(f.env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter })
	cl, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := f.options()
	o.Kube = func() (*kube.Clients, error) { return cl, nil }
	o.JSON = true
	f.out.Reset()
	if err := backup.List(ctx, &backup.ListOptions{Options: o}); err != nil {
		t.Fatal(err)
	}
	var list []backup.Summary
	if err := json.Unmarshal(f.out.Bytes(), &list); err != nil || len(list) < n {
		t.Fatalf("listed %d backups, %v", len(list), err)
	}
	t.Logf("measured: kip backup list with %d backups made %d API requests: %s", len(list), len(counter.reqs), strings.Join(counter.reqs, ", "))
	want := []string{
		"GET /api/v1/namespaces/kube-system/configmaps/kipper-records",
		"GET /apis/velero.io/v1/namespaces/velero/backups",
		"GET /apis/velero.io/v1/namespaces/velero/podvolumebackups",
		"GET /apis/velero.io/v1/namespaces/velero/deletebackuprequests",
	}
	if !slices.Equal(counter.reqs, want) {
		t.Errorf("requests %v, want %v", counter.reqs, want)
	}
}

// testExcludedCopyPodIsLeftOut: a storage move's copy pod, its claim and its volume, labelled by
// ExcludeFromBackups, are not in the backup, and kip does not expect data for the claim.
func testExcludedCopyPodIsLeftOut(t *testing.T, f *fixture) {
	f.record(t, "small", cluster.BackupsExternal)
	ctx := context.Background()
	ns := f.env.Namespace(t)
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "old-" + ns}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/rancher/k3s/storage/old"}},
		ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: "old-view"}}}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "old-view", Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}, VolumeName: pv.Name, StorageClassName: ptr.To(""),
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: ns, Annotations: testenv.FastPodAnnotations()}, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{"kipper.run/no-such-node": "true"},
		Containers:   []corev1.Container{{Name: "copy", Image: "kipper/mover:1", VolumeMounts: []corev1.VolumeMount{{Name: "old", MountPath: "/old", ReadOnly: true}}}},
		Volumes:      []corev1.Volume{{Name: "old", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "old-view", ReadOnly: true}}}}}}
	for _, obj := range []metav1.Object{pv, pvc, pod} {
		backup.ExcludeFromBackups(obj)
	}
	if _, err := f.cl.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.cl.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	if _, err := f.cl.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cl.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A running pod that leaves its claim out of file-system backups by Velero's annotation: the
	// claim is not one the backup should hold (and no node agent is asked for it).
	f.boundClaim(t, ns, "cache")
	annotations := testenv.FastPodAnnotations()
	annotations[velerov1.VolumesToExcludeAnnotation] = "cache"
	cachePod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{NodeName: f.node,
			Containers: []corev1.Container{{Name: "cache", Image: "registry.example/cache:1", VolumeMounts: []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}}},
			Volumes:    []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "cache"}}}}}}
	if _, err := f.cl.Kube.CoreV1().Pods(ns).Create(ctx, cachePod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.service(t, ns, "web")
	if _, err := backup.Create(ctx, &backup.CreateOptions{Options: f.options(), Namespaces: []string{ns}, Wait: true}); err != nil {
		t.Fatal(err)
	}
	name := f.lastBackup(t)
	list := resourceList(t, f.velero.Object(t, "backups/"+name+"/"+name+"-resource-list.json.gz"))
	for _, held := range []string{"v1/Pod:" + ns + "/copy", "v1/PersistentVolumeClaim:" + ns + "/old-view", "v1/PersistentVolume:" + pv.Name} {
		if strings.Contains(list, held) {
			t.Errorf("the backup holds %s: %s", held, list)
		}
	}
	if !strings.Contains(list, ns+"/web-config") {
		t.Errorf("the backup's resource list does not hold the service's ConfigMap: %s", list)
	}
}

// resourceList flattens Velero's <backup>-resource-list.json.gz ({"v1/Pod": ["ns/name"], …}) to
// "kind:ns/name" words.
func resourceList(t *testing.T, gz []byte) string {
	t.Helper()
	raw, err := gunzip(gz)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string][]string
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("resource list: %v: %s", err, raw)
	}
	var words []string
	for kind, names := range m {
		for _, n := range names {
			words = append(words, kind+":"+n)
		}
	}
	slices.Sort(words)
	return strings.Join(words, " ")
}

func gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}
