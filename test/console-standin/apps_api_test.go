package consolestandin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/testenv"
)

// TestApps runs the stand-in against the real API server and kwok and checks what it keeps of
// each App: a Deployment at spec.replicas running spec.image (its own image when unset), none
// running while stopped, an autoscaled count kept within the bounds (the minimum from 0, the
// nearest bound when the bounds leave it outside, as it is otherwise), the restart request on
// the pod template, and the App's status.
func TestApps(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env.AddNode(t, "standin-apps", testenv.NodeOptions{})
	s := &consolestandin.Standin{Kube: cl.Kube, Dynamic: cl.Dynamic, Image: "kip.invalid/app", Interval: time.Second, Logf: t.Logf}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(sctx) }()
	t.Cleanup(func() { stop(); <-done })

	project := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": "apps"}, "spec": map[string]any{"environments": []any{map[string]any{"name": "prod"}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(ctx, project, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Dynamic.Resource(service.ProjectsGVR).Delete(context.Background(), "apps", metav1.DeleteOptions{})
	})
	const ns = "apps-prod"
	if err := kube.Poll(ctx, time.Minute, "namespace "+ns, func(ctx context.Context) (bool, string, error) {
		_, err := cl.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	apps := cl.Dynamic.Resource(app.AppsGVR).Namespace(ns)
	create := func(name string, spec map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "App",
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
		if _, err := apps.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// edit changes App name as the console or kip would.
	edit := func(name string, change func(u *unstructured.Unstructured)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			u, err := apps.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(u)
			_, err = apps.Update(ctx, u, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// settled waits until the stand-in has acted on App name's current generation and its
	// Deployment is at want replicas, and returns the Deployment and the App.
	settled := func(name string, want int32) (*appsv1.Deployment, *app.App) {
		t.Helper()
		var d *appsv1.Deployment
		var a *app.App
		if err := kube.PollPending(ctx, time.Minute, fmt.Sprintf("Deployment %s at %d replicas", name, want), func(ctx context.Context) (string, error) {
			u, err := apps.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			if a, err = app.FromObject(service.Ref{Project: "apps", Environment: "prod", Name: name}, u); err != nil {
				return "", err
			}
			if p := a.PendingObserved(); p != "" {
				return p, nil
			}
			d, err = cl.Kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return kube.PendingGet("Deployment "+name, err)
			}
			if got := ptr.Deref(d.Spec.Replicas, 1); got != want {
				return fmt.Sprintf("at %d replicas", got), nil
			}
			return "", nil
		}); err != nil {
			t.Fatal(err)
		}
		return d, a
	}
	// phase waits until App name reports phase with ready pods ready.
	phase := func(name, phase string, ready int32) {
		t.Helper()
		if err := kube.PollPending(ctx, time.Minute, "app "+name+" "+phase, func(ctx context.Context) (string, error) {
			u, err := apps.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			a, err := app.FromObject(service.Ref{Project: "apps", Environment: "prod", Name: name}, u)
			if err != nil {
				return "", err
			}
			if a.Phase != phase || a.ReadyReplicas != ready || a.StatusReplicas != ready || a.PendingObserved() != "" {
				return fmt.Sprintf("phase %q, %d of %d ready, %s", a.Phase, a.ReadyReplicas, a.StatusReplicas, a.PendingObserved()), nil
			}
			return "", nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// setDeployment sets the Deployment's count, as an autoscaler would.
	setDeployment := func(name string, n int32) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := cl.Kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			d.Spec.Replicas = ptr.To(n)
			_, err = cl.Kube.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}

	// A plain app: its stored count and image, Running once its pods are Ready.
	create("plain", map[string]any{"image": "registry.example/plain:1", "replicas": int64(2)})
	d, _ := settled("plain", 2)
	if c := d.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Image != "registry.example/plain:1" ||
		d.Spec.Template.Labels[app.Label] != "plain" || d.Spec.Selector.MatchLabels[app.Label] != "plain" {
		t.Errorf("Deployment plain: containers %+v, labels %v", c, d.Spec.Template.Labels)
	}
	if o := d.OwnerReferences; len(o) != 1 || o[0].Kind != "App" || o[0].Name != "plain" {
		t.Errorf("Deployment plain's owners: %+v", o)
	}
	phase("plain", app.PhaseRunning, 2)
	edit("plain", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, int64(3), "spec", "replicas")
	})
	settled("plain", 3)
	phase("plain", app.PhaseRunning, 3)

	// The restart request goes onto the pod template.
	edit("plain", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{app.RestartAnnotation: "2026-01-02T03:04:05Z"})
	})
	if err := kube.PollPending(ctx, time.Minute, "the restart on Deployment plain", func(ctx context.Context) (string, error) {
		d, err := cl.Kube.AppsV1().Deployments(ns).Get(ctx, "plain", metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if got := d.Spec.Template.Annotations[app.RestartedAnnotation]; got != "2026-01-02T03:04:05Z" {
			return fmt.Sprintf("%s is %q", app.RestartedAnnotation, got), nil
		}
		return "", nil
	}); err != nil {
		t.Fatal(err)
	}

	// Stopped: no pod runs; Stopped once none is left. Without the stop, it runs again.
	edit("plain", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedMap(u.Object, map[string]any{"reason": "test", "at": "2026-01-02T03:04:05Z"}, "spec", "stop")
	})
	settled("plain", 0)
	phase("plain", app.PhaseStopped, 0)
	edit("plain", func(u *unstructured.Unstructured) { unstructured.RemoveNestedField(u.Object, "spec", "stop") })
	settled("plain", 3)
	phase("plain", app.PhaseRunning, 3)

	// An app without an image runs the stand-in's.
	create("bare", map[string]any{"replicas": int64(1)})
	if d, _ := settled("bare", 1); d.Spec.Template.Spec.Containers[0].Image != "kip.invalid/app" {
		t.Errorf("Deployment bare runs %s, want the stand-in's image", d.Spec.Template.Spec.Containers[0].Image)
	}

	// Autoscaled: created at the minimum, whatever the stored count.
	autoscale := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(4), "cpuTarget": int64(70)}
	create("auto", map[string]any{"replicas": int64(1), "autoscale": autoscale})
	settled("auto", 2)
	phase("auto", app.PhaseRunning, 2)
	// A count an autoscaler set within the bounds stays, after a pass of the stand-in's own.
	setDeployment("auto", 3)
	if err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	settled("auto", 3)
	// One outside moves to the nearest bound.
	setDeployment("auto", 9)
	settled("auto", 4)
	setDeployment("auto", 0)
	settled("auto", 2)
	// Bounds that leave the count outside move it.
	edit("auto", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, int64(5), "spec", "autoscale", "minReplicas")
		_ = unstructured.SetNestedField(u.Object, int64(6), "spec", "autoscale", "maxReplicas")
	})
	settled("auto", 5)
	// Autoscaling off: the stored count.
	edit("auto", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, false, "spec", "autoscale", "enabled")
		_ = unstructured.SetNestedField(u.Object, int64(6), "spec", "replicas")
	})
	settled("auto", 6)
}
