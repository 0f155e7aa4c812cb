package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/platform"
	"kipper.run/kip/internal/service"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/testenv"
)

// TestTwoCopies drives the offer of two copies (kip cluster storage --max-copies 2), kip service
// add with one and two copies, kip service info on a service whose data volume waits for a
// second node that can hold copies, and the recording of unset copies, against the real API
// server with the console stand-in. The nodes are kwok's: the server labelled control-plane, the
// worker recorded in kip's nodes record as the disk check would leave it; the test binds each
// claim to a volume of its class, as Longhorn's provisioner would.
func TestTwoCopies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := setup(ctx, t, "copies-worker")
	f.e.AddNode(t, "copies-server", testenv.NodeOptions{Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}})
	f.project(ctx, t, "twin", "prod")
	record := func(storage string) {
		t.Helper()
		_, err := cluster.UpdateRecord(ctx, f.cl.Dynamic, func(r *cluster.Record, _ bool) error {
			r.Profile, r.Storage, r.Server, r.KipVersion = "small", storage, "198.51.100.1", buildinfo.Version
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	record(cluster.StorageLocal)
	t.Cleanup(func() {
		_ = kube.DeleteRecord(context.Background(), f.cl.Dynamic, kube.ClusterRecords(), cluster.RecordName)
	})
	worker := func(copies string) {
		t.Helper()
		_, err := cluster.UpdateNodes(ctx, f.cl.Dynamic, func(n *cluster.Nodes) error {
			n.Workers = map[string]cluster.Worker{"copies-worker": {Host: "198.51.100.2", State: cluster.WorkerReady, Copies: copies}}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	worker(cluster.CopiesUnchecked)
	t.Cleanup(func() { _ = kube.DeleteRecord(context.Background(), f.cl.Dynamic, kube.ClusterRecords(), "nodes") })

	db := service.Ref{Project: "twin", Environment: "prod", Name: "db"}
	add := func(copies int) error {
		return service.Add(ctx, &service.AddOptions{Options: f.opts, Ref: db, Type: "postgres", Copies: copies})
	}
	offer := func(n int) error {
		return platform.OfferCopies(ctx, &platform.CopiesOptions{Options: platform.Options{Kube: f.opts.Kube, Printer: f.opts.Printer,
			Prompter: f.opts.Prompter, Holder: "kip cluster storage --max-copies 2", KipVersion: buildinfo.Version}, MaxCopies: n})
	}

	// Two copies before the offer, and the offer on local storage, are refused.
	if err := add(2); err == nil || !strings.Contains(err.Error(), "an admin offers two with 'kip cluster storage --max-copies 2'") {
		t.Fatalf("two copies before the offer: %v", err)
	}
	if err := offer(2); err == nil || !strings.Contains(err.Error(), "switch with 'kip cluster storage longhorn' first") {
		t.Fatalf("the offer on local storage: %v", err)
	}
	record(cluster.StorageLonghorn)
	if err := offer(2); err != nil {
		t.Fatal(err)
	}
	sc, err := f.e.Kube.StorageV1().StorageClasses().Get(ctx, cluster.LonghornTwoCopiesClass, metav1.GetOptions{})
	if err != nil || sc.Parameters["numberOfReplicas"] != "2" || sc.Parameters["dataLocality"] != "disabled" || sc.Provisioner != "driver.longhorn.io" {
		t.Fatalf("the two-copy class: %+v, %v", sc, err)
	}
	t.Cleanup(func() {
		_ = f.e.Kube.StorageV1().StorageClasses().Delete(context.Background(), cluster.LonghornTwoCopiesClass, metav1.DeleteOptions{})
	})
	if rec, _, err := cluster.ReadRecord(ctx, f.cl.Dynamic); err != nil || rec.MaxCopies != 2 {
		t.Fatalf("the record after the offer: %+v, %v", rec, err)
	}
	f.errOut.Reset()
	if err := offer(2); err != nil || !strings.Contains(f.errOut.String(), "The class kipper-longhorn-2 exists") || !strings.Contains(f.errOut.String(), "The record is up to date") {
		t.Fatalf("the offer again: %v\n%s", err, f.errOut)
	}
	if err := offer(1); err == nil || !strings.Contains(err.Error(), "the offer is made once") {
		t.Fatalf("taking the offer back: %v", err)
	}

	// Offered, two copies still need two Ready nodes that can hold copies: the worker's disk was
	// not checked.
	if err := add(2); err == nil || !strings.Contains(err.Error(), "two copies need two Ready nodes that can hold copies, and only copies-server can now") {
		t.Fatalf("two copies on one eligible node: %v", err)
	}
	worker(cluster.CopiesEligible)
	f.boundVolume(ctx, t, db.Namespace(), "data-db-0", cluster.LonghornTwoCopiesClass)
	f.boundVolume(ctx, t, db.Namespace(), "dump-db-0", cluster.LonghornOneCopyClass)
	if err := add(2); err != nil {
		t.Fatal(err)
	}
	set, err := f.e.Kube.AppsV1().StatefulSets(db.Namespace()).Get(ctx, "db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	classes := map[string]string{}
	for _, c := range set.Spec.VolumeClaimTemplates {
		classes[c.Name] = ptr.Deref(c.Spec.StorageClassName, "")
	}
	if classes["data"] != cluster.LonghornTwoCopiesClass || classes["dump"] != cluster.LonghornOneCopyClass {
		t.Errorf("claim classes %v: want the data volume with two copies, the dump volume with one", classes)
	}
	if err := add(2); err == nil || !strings.Contains(err.Error(), "service db in twin-prod already exists") {
		t.Errorf("adding it again: %v", err)
	}
	f.out.Reset()
	if err := service.ShowInfo(ctx, &service.ServiceOptions{Options: f.opts, Ref: db}); err != nil || !strings.Contains(f.out.String(), "Copies:       2\n") {
		t.Errorf("info of the two-copy service: %v\n%s", err, f.out)
	}

	// The number of copies never changes once set: the API server refuses it.
	_, err = f.cl.Dynamic.Resource(service.ServicesGVR).Namespace(db.Namespace()).Patch(ctx, "db", types.MergePatchType,
		[]byte(`{"spec":{"copies":1}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.copies is chosen when the service is created and cannot change") {
		t.Errorf("changing spec.copies: %v", err)
	}

	// A service with two copies that reaches console-api while one node can hold copies waits,
	// and kip service info says why.
	worker(cluster.CopiesRefused)
	late := service.Ref{Project: "twin", Environment: "prod", Name: "late"}
	f.serviceObject(ctx, t, late, map[string]any{"type": "redis", "copies": int64(2), "storageClass": cluster.LonghornOneCopyClass})
	s := &consolestandin.Standin{Kube: f.e.Kube, Dynamic: f.cl.Dynamic, Image: "kip.invalid/service", CopyHolders: cluster.CopyHolders, Logf: t.Logf}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Kube.AppsV1().StatefulSets(late.Namespace()).Get(ctx, "late", metav1.GetOptions{}); err == nil {
		t.Errorf("the stand-in created late's StatefulSet with one node that can hold copies")
	}
	f.out.Reset()
	if err := service.ShowInfo(ctx, &service.ServiceOptions{Options: f.opts, Ref: late}); err != nil ||
		!strings.Contains(f.out.String(), "Copies:       2: creation of its data volume waits for two Ready nodes that can hold copies, and only copies-server can now") {
		t.Errorf("info of a service waiting for a second node: %v\n%s", err, f.out)
	}

	// A service created before copies were recorded: info names the command that records them,
	// which accepts the number its volume keeps (one, a local volume) and only that.
	old := service.Ref{Project: "twin", Environment: "prod", Name: "old"}
	f.service(ctx, t, old, "redis")
	so := &service.ServiceOptions{Options: f.opts, Ref: old}
	f.out.Reset()
	if err := service.ShowInfo(ctx, so); err != nil ||
		!strings.Contains(f.out.String(), "Copies:       unset (one copy of its data kept); record them with 'kip service update old --project twin --environment prod --copies 1'") {
		t.Errorf("info of a service with copies unset: %v\n%s", err, f.out)
	}
	if err := service.Update(ctx, &service.UpdateOptions{ServiceOptions: *so, Copies: 2}); err == nil ||
		!strings.Contains(err.Error(), "record that with --copies 1; changing the number of copies of an existing service is not available yet") {
		t.Errorf("recording two copies of a one-copy volume: %v", err)
	}
	if err := service.Update(ctx, &service.UpdateOptions{ServiceOptions: *so, Copies: 1}); err != nil {
		t.Fatal(err)
	}
	if got, err := service.Get(ctx, f.cl.Dynamic, old); err != nil || got.Copies != 1 {
		t.Errorf("after recording: %+v, %v", got, err)
	}
}

// boundVolume creates a PersistentVolume of class bound in advance to claim, as Longhorn's
// provisioner would.
func (f *fixture) boundVolume(ctx context.Context, t *testing.T, ns, claim, class string) {
	t.Helper()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + ns + "-" + claim}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		StorageClassName:              class,
		ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: claim},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/longhorn/" + claim}},
	}}
	if _, err := f.e.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.e.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
}
