package upgrade

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/test/testenv"
)

// addApp creates the App name in ns with spec, and its Deployment at desired replicas (none
// when desired is negative).
func addApp(t testing.TB, cl *kube.Clients, ns, name string, spec map[string]any, desired int32) {
	t.Helper()
	ctx := context.Background()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "App",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
	if _, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if desired < 0 {
		return
	}
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(desired), Paused: true, Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: "registry.example/" + name + ":1"}}}}}}
	if _, err := cl.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// projectNamespace creates the namespace of project p's environment e, labelled as console-api
// labels it.
func projectNamespace(t testing.TB, cl *kube.Clients, p, e string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p + "-" + e, Labels: map[string]string{service.ProjectLabel: p}}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The tests share one cluster, and every check reads all its apps: a test's apps go with it.
	deleteAtCleanup(t, cl, ns.Name)
	return ns.Name
}

// TestAutoscalingCheck reads the apps of a real API server (Apps and Deployments) and prints
// spec 002's example word for word; the read takes three requests, however many apps there are.
func TestAutoscalingCheck(t *testing.T) {
	env := testenv.Get(t)
	cl, n := testenv.CountingClients(t, env.Config)
	ns := projectNamespace(t, cl, "shop", "prod")
	bounds := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(5), "cpuTarget": int64(70)}
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1), "autoscale": bounds}, 3)
	off := map[string]any{"enabled": false, "minReplicas": int64(2), "maxReplicas": int64(5)}
	addApp(t, cl, ns, "worker", map[string]any{"replicas": int64(3), "autoscale": off}, 4)
	addApp(t, cl, ns, "fine", map[string]any{"replicas": int64(3), "autoscale": off}, 3)
	ctx := context.Background()

	n.Take()
	apps, outside, err := ReadApps(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	requests, _ := n.Take()
	var out bytes.Buffer
	CheckApps(apps, outside, "v0.24.0").Write(&out)
	want := `  !   The new rules refuse these apps' autoscaling settings. Once the new console-api
      is running, kip upgrade changes them as shown, and nothing running changes:
      - shop-prod/api: autoscaling is on and it stores replicas 1, outside its bounds of 2 to 5, so the stored count becomes the running count when the fix is written.
          replicas: 1 → 3 (the running count when the fix is written)
  ✗   These apps need a decision, and kip upgrade does not change them:
      - shop-prod/worker: autoscaling is off, but its Deployment is set to 4 while it stores 3. Any reconcile restores 3.
          Set the count you want with 'kip app scale worker --project shop --environment prod --replicas N', with N from 2 to 5.
`
	if out.String() != want {
		t.Errorf("the check printed\n%s\nwant\n%s", out.String(), want)
	}

	// Fifty more apps in another project: the same three requests.
	more := projectNamespace(t, cl, "many", "test")
	for i := range 50 {
		addApp(t, cl, more, fmt.Sprintf("app%02d", i), map[string]any{"replicas": int64(1)}, 1)
	}
	n.Take()
	if apps, _, err = ReadApps(ctx, cl); err != nil || len(apps) != 53 {
		t.Fatalf("read %d apps, %v", len(apps), err)
	}
	if got, _ := n.Take(); requests != 3 || got != requests {
		t.Errorf("ReadApps made %d requests with 3 apps, %d with 53; want 3 each", requests, got)
	}
}

// deleteAtCleanup deletes namespace name when t ends, and waits until it is gone.
func deleteAtCleanup(t testing.TB, cl *kube.Clients, name string) {
	t.Cleanup(func() {
		if err := deleteNamespace(cl, name); err != nil {
			t.Error(err)
		}
	})
}

// deleteNamespace deletes namespace name, when there is one, and waits until it is gone.
func deleteNamespace(cl *kube.Clients, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.Kube.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	return kube.Poll(ctx, 2*time.Minute, "namespace "+name+" to go", func(ctx context.Context) (bool, string, error) {
		live, err := cl.Kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return apierrors.IsNotFound(err), err.Error(), nil
		}
		return false, fmt.Sprintf("%+v", live.Status.Conditions), nil
	})
}

// BenchmarkCheck runs kip upgrade --check on a cluster with 2,000 apps, each with its
// Deployment, in 20 project namespaces: wall time and API requests per run (spec 002: at most 20
// requests and 2 s). Its "apps" part is ReadApps and the judging alone.
func BenchmarkCheck(b *testing.B) {
	env := testenv.Get(b)
	cl, n := testenv.CountingClients(b, env.Config)
	for p := range 20 {
		ns := projectNamespace(b, cl, fmt.Sprintf("bench%02d", p), "prod")
		for i := range 100 {
			spec := map[string]any{"replicas": int64(2), "autoscale": map[string]any{"enabled": true, "minReplicas": int64(1), "maxReplicas": int64(4), "cpuTarget": int64(80)}}
			addApp(b, cl, ns, fmt.Sprintf("app%03d", i), spec, 2)
		}
	}
	ctx := context.Background()
	rec := cluster.Record{Profile: "small", Storage: cluster.StorageLonghorn, Backups: cluster.BackupsInCluster, Server: "192.0.2.30", KipVersion: "v0.23.0"}
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(r *cluster.Record, _ bool) error { *r = rec; return nil }); err != nil {
		b.Fatal(err)
	}
	b.Run("whole", func(b *testing.B) {
		n.Take()
		for b.Loop() {
			var out bytes.Buffer
			o := quietOptions(cl, &out)
			o.Check = true
			if err := Run(ctx, o); err != nil || !strings.Contains(out.String(), "(2000 apps)") {
				b.Fatalf("kip upgrade --check: %v\n%s", err, out.String())
			}
		}
		total, _ := n.Take()
		b.ReportMetric(float64(total)/float64(b.N), "requests/op")
		if total > int64(20*b.N) {
			b.Fatalf("%d API requests in %d runs: more than 20 a run", total, b.N)
		}
	})
	b.Run("apps", func(b *testing.B) {
		n.Take()
		for b.Loop() {
			apps, outside, err := ReadApps(ctx, cl)
			if err != nil || len(apps) != 2000 {
				b.Fatalf("read %d apps, %v", len(apps), err)
			}
			CheckApps(apps, outside, "v0.24.0")
		}
		total, _ := n.Take()
		b.ReportMetric(float64(total)/float64(b.N), "requests/op")
	})
}
