package kube_test

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/kube"
)

func TestDrift(t *testing.T) {
	c, _ := clients(t)
	ctx := context.Background()
	ns := "drift-" + randomSuffix()
	nsObj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}}
	// A Deployment gets many defaults from the server; a no-op apply must not count as drift.
	deploy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web", "namespace": ns},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "web"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "web", "image": "nginx:1"}}},
			},
		},
	}}
	cm := configMap(ns, "settings", "a")
	objs := []*unstructured.Unstructured{nsObj, deploy, cm}
	t.Cleanup(func() { _ = c.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{nsObj}, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	drift, err := kube.Drift(ctx, c, objs, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Deployment " + ns + "/web: missing", "ConfigMap " + ns + "/settings: missing"}
	if !slices.Equal(drift, want) {
		t.Fatalf("before apply: drift %q, want %q", drift, want)
	}

	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if drift, err = kube.Drift(ctx, c, objs, ""); err != nil || len(drift) != 0 {
		t.Fatalf("after apply: drift %q, %v; want none", drift, err)
	}

	// Someone else's change to a field kip sets is drift; a field kip does not set is not.
	// The controller-manager updates the Deployment's status meanwhile: retry on conflicts.
	update := func(change func(*appsv1.Deployment)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := c.Kube.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(d)
			_, err = c.Kube.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{FieldManager: "someone"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	update(func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "nginx:2" })
	if drift, err = kube.Drift(ctx, c, objs, ""); err != nil || !slices.Equal(drift, []string{"Deployment " + ns + "/web: changed by another field manager"}) {
		t.Fatalf("after an image change: drift %q, %v", drift, err)
	}
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	// A change through apply by kip's own manager shows as a plain difference.
	changed := cm.DeepCopy()
	changed.Object["data"] = map[string]any{"value": "b"}
	if err := kube.Apply(ctx, c, []*unstructured.Unstructured{changed}, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if drift, err = kube.Drift(ctx, c, objs, ""); err != nil || !slices.Equal(drift, []string{"ConfigMap " + ns + "/settings: differs"}) {
		t.Fatalf("after a value change: drift %q, %v", drift, err)
	}
	if err := kube.Apply(ctx, c, objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	update(func(d *appsv1.Deployment) { d.Annotations = map[string]string{"note": "an operator's own annotation"} })
	if drift, err = kube.Drift(ctx, c, objs, ""); err != nil || len(drift) != 0 {
		t.Fatalf("after an unrelated annotation: drift %q, %v; want none", drift, err)
	}
}
