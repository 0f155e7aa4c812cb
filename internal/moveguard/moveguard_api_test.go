package moveguard_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/test/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func applyPolicies(ctx context.Context, t *testing.T, e *testenv.Env) {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, p := range moveguard.Policies() {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	cl, err := kube.NewClients(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.Apply(ctx, cl, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
}

func namespace(ctx context.Context, t *testing.T, e *testenv.Env, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := e.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podWith(name string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	for i, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "v" + string(rune('a'+i)), VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

// TestFenceKeepsOtherPodsOffAndTheNamespaceAlive runs the policies in the real API server: with a
// guard up, a pod mounting a guarded claim is refused unless the guard names it, a pod of another
// claim or namespace is admitted, a cluster admin cannot delete the namespace, and CheckEnforced
// passes; with the guard lifted or its ConfigMap changed, each is noticed.
func TestFenceKeepsOtherPodsOffAndTheNamespaceAlive(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	applyPolicies(ctx, t, e)
	namespace(ctx, t, e, "shop-staging")
	namespace(ctx, t, e, "shop-prod")
	f := moveguard.Guard{Namespace: "shop-staging", Service: "db", Claims: []string{"data-db-0", "kip-move-db"},
		Pods: []string{"kip-move-copy-db", "kip-move-verify-db"}, Info: "kip service info db --project shop --environment staging"}

	// Before the guard: nothing is refused, so CheckEnforced must fail, naming what was allowed.
	err := moveguard.CheckEnforced(ctx, e.Kube, f, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "allowed (dry run)") {
		t.Fatalf("CheckEnforced without a fence: %v, want a timeout naming what was allowed", err)
	}

	if err := f.Put(ctx, e.Kube); err != nil {
		t.Fatal(err)
	}
	if err := moveguard.CheckEnforced(ctx, e.Kube, f, moveguard.EnforceTimeout); err != nil {
		t.Fatal(err)
	}
	create := func(ns string, p *corev1.Pod) error {
		_, err := e.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	for _, c := range []struct {
		ns     string
		pod    *corev1.Pod
		refuse bool
	}{
		{"shop-staging", podWith("db-0", "data-db-0"), true},
		{"shop-staging", podWith("reader", "other", "kip-move-db"), true},
		{"shop-staging", podWith("kip-move-copy-db", "data-db-0", "kip-move-db"), false},
		{"shop-staging", podWith("kip-move-verify-db", "data-db-0", "kip-move-db"), false},
		{"shop-staging", podWith("app", "uploads"), false},
		{"shop-staging", podWith("no-volumes"), false},
		{"shop-prod", podWith("db-0", "data-db-0"), false},
	} {
		err := create(c.ns, c.pod)
		switch {
		case c.refuse && (err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "kip is moving the data of service db in shop-staging to Longhorn: no pod may mount its volumes (data-db-0 kip-move-db) until the move finishes or is rolled back (kip service info db --project shop --environment staging shows it)")):
			t.Errorf("pod %s/%s: %v, want the fence's refusal", c.ns, c.pod.Name, err)
		case !c.refuse && err != nil:
			t.Errorf("pod %s/%s: %v, want it admitted", c.ns, c.pod.Name, err)
		}
	}
	err = e.Kube.CoreV1().Namespaces().Delete(ctx, "shop-staging", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot be deleted while kip moves the data of service db") {
		t.Fatalf("delete namespace under move: %v, want the policy's refusal", err)
	}
	if why, err := f.Intact(ctx, e.Kube); err != nil || why != "" {
		t.Fatalf("Intact: %q, %v", why, err)
	}
	// A second move in the namespace has a guard of its own; the namespace names both, and stays
	// protected while either is up.
	other := moveguard.Guard{Namespace: "shop-staging", Service: "cache", Claims: []string{"data-cache-0"}, Pods: []string{"kip-move-copy-cache"},
		Info: "kip service info cache --project shop --environment staging"}
	if err := other.Put(ctx, e.Kube); err != nil {
		t.Fatal(err)
	}
	if err := moveguard.CheckEnforced(ctx, e.Kube, other, moveguard.EnforceTimeout); err != nil {
		t.Fatal(err)
	}
	err = e.Kube.CoreV1().Namespaces().Delete(ctx, "shop-staging", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot be deleted while kip moves the data of service") ||
		!strings.Contains(err.Error(), "service cache") || !strings.Contains(err.Error(), "service db") {
		t.Fatalf("delete namespace under two moves: %v", err)
	}
	if err := create("shop-staging", podWith("kip-move-copy-db", "data-cache-0")); err == nil {
		t.Error("db's copy pod mounted cache's fenced claim")
	}
	if err := moveguard.Lift(ctx, e.Kube, "shop-staging", "cache"); err != nil {
		t.Fatal(err)
	}

	// Someone edits the guard: Intact names it.
	patch := `{"data":{"pods":"kip-move-copy-db intruder"}}`
	if _, err := e.Kube.CoreV1().ConfigMaps("shop-staging").Patch(ctx, moveguard.ConfigMapName("db"), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if why, err := f.Intact(ctx, e.Kube); err != nil || !strings.Contains(why, "was changed") {
		t.Fatalf("Intact after an edit: %q, %v", why, err)
	}
	if err := f.Put(ctx, e.Kube); err != nil {
		t.Fatal(err)
	}
	if why, err := f.Intact(ctx, e.Kube); err != nil || why != "" {
		t.Fatalf("Intact after Put again: %q, %v", why, err)
	}

	// A guard whose ConfigMap is gone but whose namespace label is left is not lifted.
	if lifted, err := moveguard.Lifted(ctx, e.Kube, "shop-staging", "db"); err != nil || lifted {
		t.Fatalf("Lifted with the fence up: %v, %v", lifted, err)
	}
	if err := e.Kube.CoreV1().ConfigMaps("shop-staging").Delete(ctx, moveguard.ConfigMapName("db"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if lifted, err := moveguard.Lifted(ctx, e.Kube, "shop-staging", "db"); err != nil || lifted {
		t.Fatalf("Lifted with the namespace still labelled: %v, %v", lifted, err)
	}

	// Lifted: pods are admitted again, the namespace can go, and Intact says the guard is gone.
	if err := moveguard.Lift(ctx, e.Kube, "shop-staging", "db"); err != nil {
		t.Fatal(err)
	}
	if lifted, err := moveguard.Lifted(ctx, e.Kube, "shop-staging", "db"); err != nil || !lifted {
		t.Fatalf("Lifted after Lift: %v, %v", lifted, err)
	}
	if err := moveguard.Lift(ctx, e.Kube, "shop-staging", "db"); err != nil {
		t.Fatalf("a second Lift: %v", err)
	}
	if why, err := f.Intact(ctx, e.Kube); err != nil || !strings.Contains(why, "is gone") {
		t.Fatalf("Intact after Lift: %q, %v", why, err)
	}
	if err := kube.Poll(ctx, moveguard.EnforceTimeout, "the lifted fence to admit db-0", func(ctx context.Context) (bool, string, error) {
		err := create("shop-staging", podWith("db-0", "data-db-0"))
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Kube.CoreV1().Namespaces().Delete(ctx, "shop-staging", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("delete namespace after the move: %v", err)
	}
}

// TestFenceRefusesANamespaceBeingDeleted: a move never starts in a namespace already going away.
func TestFenceRefusesANamespaceBeingDeleted(t *testing.T) {
	e := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	namespace(ctx, t, e, "going-away")
	// A finalizer of the test's own keeps the namespace in Terminating.
	ns, err := e.Kube.CoreV1().Namespaces().Get(ctx, "going-away", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Spec.Finalizers = append(ns.Spec.Finalizers, "kipper.run/test")
	if _, err := e.Kube.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.Kube.CoreV1().Namespaces().Delete(ctx, "going-away", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f := moveguard.Guard{Namespace: "going-away", Service: "db", Claims: []string{"data-db-0"}}
	if err := f.Put(ctx, e.Kube); err == nil || !strings.Contains(err.Error(), "is being deleted") {
		t.Fatalf("Put in a namespace being deleted: %v", err)
	}
}
