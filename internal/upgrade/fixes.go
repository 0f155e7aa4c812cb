package upgrade

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/kube"
)

// The autoscaling fixes are written late (spec 002, "What the upgrade does with the findings"):
// once the new console-api serves alone, since a console-api older than stops would start an
// app a repair marks as stopped. Each app is read again first, and its fix is written only
// while it is still the fix the operator approved; a stored-count repair's consent covers the
// Deployment's latest desired count within the bounds.

// fixOutcome is what became of one approved fix.
type fixOutcome struct {
	app     string
	written bool
	// why says why the fix was not written: the app changed since it was approved, or it needs
	// no fix any more.
	why string
}

// readApp reads one App and its Deployment again, as ReadApps reads them.
func readApp(ctx context.Context, cl *kube.Clients, a *App) (*App, *unstructured.Unstructured, error) {
	u, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(a.Namespace()).Get(ctx, a.Name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	fresh := appOf(u)
	fresh.Project, fresh.Environment = a.Project, a.Environment
	d, err := cl.Kube.AppsV1().Deployments(a.Namespace()).Get(ctx, a.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fresh.Missing = true
	case err != nil:
		fresh.DeploymentErr = err
	default:
		fresh.Desired = d.Spec.Replicas
		if fresh.Desired == nil {
			fresh.Desired = ptr.To[int32](1)
		}
	}
	return fresh, u, nil
}

// sameFix reports whether the fix found now is the one approved.
func sameFix(approved, now *Fix) bool {
	return approved != nil && now != nil && approved.FromDeployment == now.FromDeployment &&
		ptr.Equal(approved.Replicas, now.Replicas) && ptr.Equal(approved.Min, now.Min) &&
		ptr.Equal(approved.Max, now.Max) && approved.StopReason == now.StopReason
}

// writeFix writes f's fix, approved by the operator, after reading its app again: a single App
// update, refused by the API server if the app changed after this read.
func writeFix(ctx context.Context, cl *kube.Clients, f *Finding, kipVersion string, now time.Time) (fixOutcome, error) {
	out := fixOutcome{app: f.App.String()}
	fresh, u, err := readApp(ctx, cl, f.App)
	if apierrors.IsNotFound(err) {
		out.why = "it no longer exists"
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read app %s again before its fix: %w", f.App, err)
	}
	found := CheckApp(fresh, kipVersion)
	switch {
	case found == nil:
		out.why = "it meets the new rules now"
		return out, nil
	case found.Kind != Repair || !sameFix(f.Fix, found.Fix):
		out.why = "it changed since you approved its fix; run kip upgrade --check to see it again"
		return out, nil
	}
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	if spec == nil {
		spec = map[string]any{}
	}
	fix := found.Fix
	switch {
	case fix.FromDeployment:
		spec["replicas"] = int64(*fresh.Desired)
	case fix.Replicas != nil:
		spec["replicas"] = int64(*fix.Replicas)
	}
	if fix.Min != nil || fix.Max != nil {
		scale, _, _ := unstructured.NestedMap(spec, "autoscale")
		if scale == nil {
			scale = map[string]any{}
		}
		if fix.Min != nil {
			scale["minReplicas"] = int64(*fix.Min)
		}
		if fix.Max != nil {
			scale["maxReplicas"] = int64(*fix.Max)
		}
		spec["autoscale"] = scale
	}
	if fix.StopReason != "" {
		spec["stop"] = map[string]any{"reason": fix.StopReason, "at": now.UTC().Format(time.RFC3339)}
	}
	if err := unstructured.SetNestedMap(u.Object, spec, "spec"); err != nil {
		return out, err
	}
	if _, err := cl.Dynamic.Resource(app.AppsGVR).Namespace(u.GetNamespace()).Update(ctx, u, metav1.UpdateOptions{FieldManager: kube.FieldManager}); err != nil {
		return out, fmt.Errorf("write the autoscaling fix of app %s: %w", f.App, err)
	}
	out.written = true
	return out, nil
}
