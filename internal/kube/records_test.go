package kube_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

type counter struct {
	N    int    `json:"n"`
	Note string `json:"note,omitempty"`
}

func dynamicClient(t *testing.T, env *testenv.Env) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

func TestObjectRefString(t *testing.T) {
	for _, tc := range []struct {
		ref  kube.ObjectRef
		want string
	}{
		{kube.NodeRef("w1"), "nodes/w1"},
		{kube.ClusterRecords(), "configmaps/kipper-records in kube-system"},
		{kube.StatefulSetRef("shop", "db"), "statefulsets.apps/db in shop"},
		{kube.PVCRef("shop", "data-db-0"), "persistentvolumeclaims/data-db-0 in shop"},
	} {
		if got := tc.ref.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// TestUpdateRecordLosesNoUpdate has 20 writers increment one counter 10 times each, all at once:
// optimistic concurrency with retries must count every increment.
func TestUpdateRecordLosesNoUpdate(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ref := kube.ConfigMapRef(env.Namespace(t), "records")
	ctx := t.Context()

	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 20 {
		wg.Go(func() {
			for range 10 {
				_, err := kube.UpdateRecord(ctx, dyn, ref, "counter", 1, func(c *counter, _ bool) error {
					c.N++
					return nil
				})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, found, err := kube.ReadRecord[counter](ctx, dyn, ref, "counter", 1)
	if err != nil || !found || got.N != 200 {
		t.Fatalf("counter = %+v, found %v, err %v; want 200", got, found, err)
	}
}

// TestUpdateRecordCreateRace has writers race to create the missing record ConfigMap, each with
// a record of its own and an increment of a shared one.
func TestUpdateRecordCreateRace(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ref := kube.ConfigMapRef(env.Namespace(t), "kipper-records")
	ctx := t.Context()

	const writers = 10
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			if _, err := kube.UpdateRecord(ctx, dyn, ref, fmt.Sprintf("own-%d", i), 1, func(c *counter, found bool) error {
				if found {
					return fmt.Errorf("record own-%d already exists", i)
				}
				c.N = i
				return nil
			}); err != nil {
				t.Error(err)
			}
			if _, err := kube.UpdateRecord(ctx, dyn, ref, "shared", 1, func(c *counter, _ bool) error {
				c.N++
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	all, err := kube.ReadRecords[counter](ctx, dyn, ref, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers+1 || all["shared"].N != writers {
		t.Fatalf("records = %+v, want %d own records and shared = %d", all, writers, writers)
	}
	for i := range writers {
		if got := all[fmt.Sprintf("own-%d", i)]; got.N != i {
			t.Errorf("own-%d = %+v", i, got)
		}
	}
	cm, err := env.Kube.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels["app.kubernetes.io/managed-by"] != "kip" {
		t.Errorf("created ConfigMap labels = %v, want managed-by kip", cm.Labels)
	}
}

func TestRecordWrittenByNewerKipIsRefused(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ns := env.Namespace(t)
	ref := kube.ConfigMapRef(ns, "records")
	ctx := t.Context()

	if _, err := kube.UpdateRecord(ctx, dyn, ref, "fence", 3, func(c *counter, _ bool) error {
		c.N = 7
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := "record kipper.run/fence on configmaps/records in " + ns +
		" was written by a newer kip (format 3, this kip knows 2): upgrade kip"
	if _, _, err := kube.ReadRecord[counter](ctx, dyn, ref, "fence", 2); err == nil || err.Error() != want {
		t.Errorf("ReadRecord error = %v\nwant %s", err, want)
	}
	called := false
	if _, err := kube.UpdateRecord(ctx, dyn, ref, "fence", 2, func(c *counter, _ bool) error {
		called = true
		return nil
	}); err == nil || err.Error() != want {
		t.Errorf("UpdateRecord error = %v\nwant %s", err, want)
	}
	if called {
		t.Error("UpdateRecord ran mutate on a record it cannot read")
	}
	if got, _, err := kube.ReadRecord[counter](ctx, dyn, ref, "fence", 3); err != nil || got.N != 7 {
		t.Errorf("record after refused update = %+v, %v; want it untouched", got, err)
	}

	// An older format is read as it is; a foreign annotation is no kip record.
	if _, err := kube.UpdateRecord(ctx, dyn, ref, "old", 1, func(c *counter, _ bool) error {
		c.N = 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, found, err := kube.ReadRecord[counter](ctx, dyn, ref, "old", 2); err != nil || !found || got.N != 1 {
		t.Errorf("older record = %+v, %v, %v", got, found, err)
	}
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "records", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Annotations["kipper.run/garbage"] = "not json"
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantBad := "record kipper.run/garbage on configmaps/records in " + ns + " is not a versioned kip record"
	if _, _, err := kube.ReadRecord[counter](ctx, dyn, ref, "garbage", 1); err == nil || err.Error() != wantBad {
		t.Errorf("garbage record error = %v, want %s", err, wantBad)
	}
}

// TestRecordsOnObjects keeps records on a Node and a PVC: kip writes to objects that exist and
// never creates them.
func TestRecordsOnObjects(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ctx := t.Context()
	ns := env.Namespace(t)
	node := "records-" + ns
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}

	for _, ref := range []kube.ObjectRef{kube.NodeRef(node), kube.PVCRef(ns, "data")} {
		t.Run(ref.Resource, func(t *testing.T) {
			if _, found, err := kube.ReadRecord[counter](ctx, dyn, ref, "fence", 1); err != nil || found {
				t.Fatalf("record on missing object: found %v, err %v", found, err)
			}
			if _, err := kube.UpdateRecord(ctx, dyn, ref, "fence", 1, func(c *counter, _ bool) error { return nil }); err == nil {
				t.Fatal("UpdateRecord created a missing " + ref.Resource)
			}
			if err := kube.DeleteRecord(ctx, dyn, ref, "fence"); err != nil {
				t.Fatalf("DeleteRecord on a missing object: %v", err)
			}

			var err error
			if ref.Resource == "nodes" {
				_, err = env.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
				t.Cleanup(func() {
					_ = env.Kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
				})
			} else {
				_, err = env.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}

			for i := range 2 {
				got, err := kube.UpdateRecord(ctx, dyn, ref, "fence", 1, func(c *counter, found bool) error {
					if found != (i == 1) {
						return fmt.Errorf("update %d: found = %v", i, found)
					}
					c.N++
					c.Note = "fenced"
					return nil
				})
				if err != nil || got.N != i+1 {
					t.Fatalf("update %d = %+v, %v", i, got, err)
				}
			}
			got, found, err := kube.ReadRecord[counter](ctx, dyn, ref, "fence", 1)
			if err != nil || !found || got != (counter{N: 2, Note: "fenced"}) {
				t.Fatalf("ReadRecord = %+v, %v, %v", got, found, err)
			}
			if err := kube.DeleteRecord(ctx, dyn, ref, "fence"); err != nil {
				t.Fatal(err)
			}
			if err := kube.DeleteRecord(ctx, dyn, ref, "fence"); err != nil {
				t.Fatalf("second DeleteRecord: %v", err)
			}
			if _, found, err := kube.ReadRecord[counter](ctx, dyn, ref, "fence", 1); err != nil || found {
				t.Fatalf("after DeleteRecord: found %v, err %v", found, err)
			}
		})
	}
}

func TestClusterRecordsObject(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ctx := t.Context()
	name := "test-" + env.Namespace(t)
	t.Cleanup(func() { _ = kube.DeleteRecord(context.Background(), dyn, kube.ClusterRecords(), name) })

	if _, err := kube.UpdateRecord(ctx, dyn, kube.ClusterRecords(), name, 1, func(c *counter, _ bool) error {
		c.N = 1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cm, err := env.Kube.CoreV1().ConfigMaps("kube-system").Get(ctx, "kipper-records", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cm.Annotations["kipper.run/"+name], `{"version":1,"data":{"n":1}}`; got != want {
		t.Errorf("annotation = %s, want %s", got, want)
	}
}

// TestUpdateRecordUnchangedDoesNotWrite: writing what is already stored leaves the object alone.
func TestUpdateRecordUnchangedDoesNotWrite(t *testing.T) {
	env := testenv.Get(t)
	dyn := dynamicClient(t, env)
	ctx := t.Context()
	ref := kube.ConfigMapRef(env.Namespace(t), "records")
	set := func(c *counter, _ bool) error {
		c.N = 5
		return nil
	}
	if _, err := kube.UpdateRecord(ctx, dyn, ref, "same", 1, set); err != nil {
		t.Fatal(err)
	}
	before, err := env.Kube.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.UpdateRecord(ctx, dyn, ref, "same", 1, set); err != nil {
		t.Fatal(err)
	}
	after, err := env.Kube.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if before.ResourceVersion != after.ResourceVersion {
		t.Errorf("resourceVersion moved from %s to %s on an unchanged record", before.ResourceVersion, after.ResourceVersion)
	}
}
