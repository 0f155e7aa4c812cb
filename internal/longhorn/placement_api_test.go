package longhorn

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's API tests (started on first use
// by testenv.Get, stopped when the tests end).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestPlacementStep keeps single-copy volumes on the server against the real API server: the
// server's Longhorn node tagged (its own tag kept), each one-copy volume without a selector
// pinned, a volume with the operator's selector and a two-copy volume left alone; a run stopped
// after its first write (the tag) is not done and finishes on the next; then it is done, and
// changes nothing.
func TestPlacementStep(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pl-srv", Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}}}
	if _, err := cl.Kube.CoreV1().Nodes().Create(ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Kube.CoreV1().Nodes().Delete(context.Background(), server.Name, metav1.DeleteOptions{}) })
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	lh := cl.Longhorn.LonghornV1beta2()
	n := &longhornv1beta2.Node{ObjectMeta: metav1.ObjectMeta{Name: "pl-srv", Namespace: Namespace}, Spec: longhornv1beta2.NodeSpec{AllowScheduling: true, Tags: []string{"ssd"}}}
	if _, err := lh.Nodes(Namespace).Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lh.Nodes(Namespace).Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	for _, v := range []struct {
		name     string
		copies   int
		selector []string
	}{{"pl-one", 1, nil}, {"pl-pinned", 1, []string{ServerTag}}, {"pl-own", 1, []string{"ssd"}}, {"pl-two", 2, nil}} {
		vol := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: v.name, Namespace: Namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, v.copies)}
		vol.Spec.NodeSelector = v.selector
		if _, err := lh.Volumes(Namespace).Create(ctx, vol, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lh.Volumes(Namespace).Delete(context.Background(), v.name, metav1.DeleteOptions{}) })
	}
	selectors := func() map[string][]string {
		t.Helper()
		list, err := lh.Volumes(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, v := range list.Items {
			out[v.Name] = v.Spec.NodeSelector
		}
		return out
	}
	step := PlacementStep(cl)
	if done, err := step.Check(ctx); err != nil || done {
		t.Fatalf("check before: %v %v", done, err)
	}
	// Stopped after the tag: the volume is not pinned yet, so the step is not done.
	if err := TagServer(ctx, cl, "pl-srv"); err != nil {
		t.Fatal(err)
	}
	if done, err := step.Check(ctx); err != nil || done {
		t.Fatalf("check after the tag alone: %v %v", done, err)
	}
	if err := step.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := step.Check(ctx); err != nil || !done {
		t.Fatalf("check after: %v %v", done, err)
	}
	got, err := lh.Nodes(Namespace).Get(ctx, "pl-srv", metav1.GetOptions{})
	if err != nil || !slices.Equal(got.Spec.Tags, []string{"ssd", ServerTag}) {
		t.Errorf("the server's Longhorn node's tags: %v (%v)", got.Spec.Tags, err)
	}
	want := map[string][]string{"pl-one": {ServerTag}, "pl-pinned": {ServerTag}, "pl-own": {"ssd"}, "pl-two": nil}
	sel := selectors()
	for name, w := range want {
		if !slices.Equal(sel[name], w) {
			t.Errorf("volume %s's node selector is %v, want %v", name, sel[name], w)
		}
	}
	// Again: nothing to write.
	before := got.ResourceVersion
	if err := step.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := lh.Nodes(Namespace).Get(ctx, "pl-srv", metav1.GetOptions{}); err != nil || got.ResourceVersion != before {
		t.Errorf("a second apply wrote the server's Longhorn node: %v", err)
	}
}
