package velerotest

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path"
	"slices"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestBackupAndRestore backs a namespace up with the real Velero server into the S3 server, finds
// the backup's files in the bucket, restores it into another namespace, stops the server (a
// Backup created meanwhile gets no phase) and resumes it (the Backup completes).
func TestBackupAndRestore(t *testing.T) {
	env := testenv.Get(t)
	began := time.Now()
	v := Start(t, env)
	startTime := time.Since(began)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	ns := env.Namespace(t)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "app-config", Namespace: ns},
		Data:       map[string]string{"greeting": "hello from " + ns},
	}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "busybox"}}},
			},
		},
	}
	if _, err := env.Kube.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Backup.
	t0 := time.Now()
	name := "kiptest-" + suffix()
	create(ctx, t, dyn, BackupResource, &velerov1.Backup{
		TypeMeta:   metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Backup"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v.Namespace},
		Spec: velerov1.BackupSpec{
			IncludedNamespaces: []string{ns},
			StorageLocation:    v.Location,
		},
	})
	var backup velerov1.Backup
	waitPhase(ctx, t, v, dyn, BackupResource, name, &backup, func() (string, bool) {
		p := backup.Status.Phase
		return string(p), p == velerov1.BackupPhaseCompleted
	}, string(velerov1.BackupPhaseFailed), string(velerov1.BackupPhasePartiallyFailed), string(velerov1.BackupPhaseFailedValidation))
	backupTime := time.Since(t0)
	if backup.Status.Errors != 0 {
		t.Errorf("backup %s: %d errors", name, backup.Status.Errors)
	}

	prefix := "backups/" + name + "/"
	keys := v.Objects(t, prefix)
	t.Logf("objects under %s: %v", prefix, keys)
	for _, want := range []string{name + ".tar.gz", "velero-backup.json", name + "-logs.gz", name + "-resource-list.json.gz"} {
		if !slices.Contains(keys, prefix+want) {
			t.Errorf("bucket has no %s%s", prefix, want)
		}
	}
	var stored velerov1.Backup
	if err := json.Unmarshal(v.Object(t, prefix+"velero-backup.json"), &stored); err != nil {
		t.Fatalf("decode velero-backup.json: %v", err)
	}
	if stored.Name != name || !slices.Equal(stored.Spec.IncludedNamespaces, []string{ns}) {
		t.Errorf("velero-backup.json: backup %q of %v, want %q of [%s]", stored.Name, stored.Spec.IncludedNamespaces, name, ns)
	}
	var resources map[string][]string
	if err := json.Unmarshal(gunzip(t, v.Object(t, prefix+name+"-resource-list.json.gz")), &resources); err != nil {
		t.Fatalf("decode the resource list: %v", err)
	}
	for gvk, item := range map[string]string{"v1/ConfigMap": ns + "/app-config", "apps/v1/Deployment": ns + "/web"} {
		if !slices.Contains(resources[gvk], item) {
			t.Errorf("resource list: %s has %v, want %s", gvk, resources[gvk], item)
		}
	}

	// Restore into another namespace.
	t0 = time.Now()
	target := "restored-" + suffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := env.Kube.CoreV1().Namespaces().Delete(ctx, target, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", target, err)
		}
	})
	restoreName := name + "-restore"
	create(ctx, t, dyn, RestoreResource, &velerov1.Restore{
		TypeMeta:   metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Restore"},
		ObjectMeta: metav1.ObjectMeta{Name: restoreName, Namespace: v.Namespace},
		Spec: velerov1.RestoreSpec{
			BackupName:       name,
			NamespaceMapping: map[string]string{ns: target},
		},
	})
	var restore velerov1.Restore
	waitPhase(ctx, t, v, dyn, RestoreResource, restoreName, &restore, func() (string, bool) {
		p := restore.Status.Phase
		return string(p), p == velerov1.RestorePhaseCompleted
	}, string(velerov1.RestorePhaseFailed), string(velerov1.RestorePhasePartiallyFailed), string(velerov1.RestorePhaseFailedValidation))
	restoreTime := time.Since(t0)
	got, err := env.Kube.CoreV1().ConfigMaps(target).Get(ctx, "app-config", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("restored ConfigMap: %v", err)
	}
	if got.Data["greeting"] != cm.Data["greeting"] {
		t.Errorf("restored ConfigMap data %v, want %v", got.Data, cm.Data)
	}
	if _, err := env.Kube.AppsV1().Deployments(target).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("restored Deployment: %v", err)
	}
	if keys := v.Objects(t, "restores/"+restoreName+"/"); len(keys) == 0 {
		t.Errorf("bucket has nothing under restores/%s/", restoreName)
	}

	// Stopped, the server leaves a new Backup alone; resumed, it completes it.
	v.Stop(t)
	second := name + "-2"
	create(ctx, t, dyn, BackupResource, &velerov1.Backup{
		TypeMeta:   metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "Backup"},
		ObjectMeta: metav1.ObjectMeta{Name: second, Namespace: v.Namespace},
		Spec:       velerov1.BackupSpec{IncludedNamespaces: []string{ns}, StorageLocation: v.Location},
	})
	time.Sleep(2 * time.Second)
	get(ctx, t, dyn, BackupResource, second, &backup)
	if backup.Status.Phase != "" {
		t.Errorf("backup %s has phase %q with the server stopped", second, backup.Status.Phase)
	}
	t0 = time.Now()
	v.Resume(t)
	waitPhase(ctx, t, v, dyn, BackupResource, second, &backup, func() (string, bool) {
		p := backup.Status.Phase
		return string(p), p == velerov1.BackupPhaseCompleted
	}, string(velerov1.BackupPhaseFailed), string(velerov1.BackupPhasePartiallyFailed), string(velerov1.BackupPhaseFailedValidation))
	resumeTime := time.Since(t0)
	if keys := v.Objects(t, "backups/"+second+"/"); !slices.Contains(keys, "backups/"+second+"/"+second+".tar.gz") {
		t.Errorf("bucket has no backups/%s/%s.tar.gz: %v", second, second, keys)
	}
	t.Logf("measured: Start %s, backup Completed %s, restore Completed %s, resume to second backup Completed %s",
		startTime.Round(time.Millisecond), backupTime.Round(time.Millisecond), restoreTime.Round(time.Millisecond), resumeTime.Round(time.Millisecond))
}

func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func create(ctx context.Context, t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, obj runtime.Object) {
	t.Helper()
	u, err := toUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gvr).Namespace(Namespace).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s %s: %v", gvr.Resource, u.GetName(), err)
	}
}

func get(ctx context.Context, t *testing.T, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string, into any) {
	t.Helper()
	u, err := dyn.Resource(gvr).Namespace(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s %s: %v", gvr.Resource, name, err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatal(err)
	}
}

// waitPhase reads the object into into until done reports its phase final, failing at once on a
// phase of failed.
func waitPhase(ctx context.Context, t *testing.T, v *Server, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string, into any, done func() (string, bool), failed ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		get(ctx, t, dyn, gvr, name, into)
		phase, ok := done()
		if ok {
			return
		}
		if slices.Contains(failed, phase) || time.Now().After(deadline) {
			status, _ := json.MarshalIndent(into, "", "  ")
			// What Velero uploads at the end: the errors and warnings it met.
			results := "backups/" + name + "/" + name + "-results.gz"
			if gvr == RestoreResource {
				results = "restores/" + name + "/restore-" + name + "-results.gz"
			}
			if slices.Contains(v.Objects(t, path.Dir(results)+"/"), results) {
				status = append(status, "\n"+results+": "...)
				status = append(status, gunzip(t, v.Object(t, results))...)
			}
			t.Fatalf("%s %s: phase %q:\n%s", gvr.Resource, name, phase, status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
