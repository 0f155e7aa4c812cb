package consolestandin

import (
	"context"
	"fmt"
	"reflect"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// app keeps the Deployment of App u as console-api does (docs/console.md): its count, its pods'
// image and restart annotation, and the App's status.
func (s *Standin) app(ctx context.Context, u *unstructured.Unstructured) error {
	if u.GetDeletionTimestamp() != nil {
		return nil // the garbage collector removes the Deployment it owns
	}
	ns := u.GetNamespace()
	nsObj, err := s.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", ns, err)
	}
	if nsObj.DeletionTimestamp != nil {
		return nil // its namespace goes, and the App with it
	}
	project := nsObj.Labels[service.ProjectLabel]
	if project == "" {
		return fmt.Errorf("app %s/%s: namespace %s belongs to no project", ns, u.GetName(), ns)
	}
	a, err := app.FromObject(service.RefIn(project, ns, u.GetName()), u)
	if err != nil {
		return err
	}
	deployments := s.Kube.AppsV1().Deployments(ns)
	live, err := deployments.Get(ctx, a.Deployment(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		live, err = deployments.Create(ctx, s.deployment(u, a, appReplicas(a, nil)), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Deployment %s/%s: %w", ns, a.Deployment(), err)
		}
	case err != nil:
		return fmt.Errorf("read Deployment %s/%s: %w", ns, a.Deployment(), err)
	default:
		want := s.deployment(u, a, appReplicas(a, live.Spec.Replicas))
		live.Spec.Replicas, live.Spec.Template = want.Spec.Replicas, want.Spec.Template
		switch live, err = deployments.Update(ctx, live, metav1.UpdateOptions{}); {
		case apierrors.IsConflict(err):
			return nil // the Deployment controller wrote its status meanwhile: the next pass updates it
		case err != nil:
			return fmt.Errorf("update Deployment %s/%s: %w", ns, a.Deployment(), err)
		}
	}
	pods, err := app.Pods(ctx, s.Kube, a, live)
	if err != nil {
		return err
	}
	status := map[string]any{"phase": appPhase(live, pods), "replicas": int64(live.Status.Replicas),
		"readyReplicas": int64(live.Status.ReadyReplicas), "observedGeneration": u.GetGeneration()}
	if old, _, _ := unstructured.NestedMap(u.Object, "status"); reflect.DeepEqual(old, status) {
		return nil
	}
	u.Object["status"] = status
	if _, err := s.Dynamic.Resource(app.AppsGVR).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update the status of app %s/%s: %w", ns, u.GetName(), err)
	}
	return nil
}

// appReplicas is the count the app's Deployment runs at, current its count now (nil when it does
// not exist): 0 while the app is stopped; with autoscaling on, the count now when it lies within
// the bounds, else the nearest bound, and the minimum from 0 (the stand-in has no autoscaler of
// its own: the count moves only when the bounds leave it outside); else the stored count. An App
// whose autoscaling block the rules refuse keeps the count it runs at.
func appReplicas(a *app.App, current *int32) int32 {
	now := ptr.Deref(current, 0)
	switch {
	case a.Stopped():
		return 0
	case a.Autoscale.Invalid() != "" && current != nil:
		return now
	case a.Autoscale.Invalid() != "":
		return a.Replicas
	case a.Autoscale.Enabled && now == 0:
		return int32(a.Autoscale.Bounds().Lo)
	case a.Autoscale.Enabled:
		return a.Autoscale.Bounds().Clamp(now)
	}
	return a.Replicas
}

// appPhase is Running (rolled out, every replica Ready), Stopped (at 0 with no pod left),
// Stopping (at 0 with a pod left) or Starting.
func appPhase(d *appsv1.Deployment, pods []corev1.Pod) string {
	want := ptr.Deref(d.Spec.Replicas, 1)
	if want == 0 {
		if len(pods) == 0 {
			return app.PhaseStopped
		}
		return app.PhaseStopping
	}
	if done, _, _ := kube.RolloutStatus(d); done && d.Status.ReadyReplicas >= want {
		return app.PhaseRunning
	}
	return app.PhaseStarting
}

// deployment is the Deployment console-api keeps for app a (owner u) at replicas: its pods carry
// the app's label, run spec.image (the stand-in's Image when unset) with the stand-in's Command,
// and carry the app's restart request as RestartedAnnotation.
func (s *Standin) deployment(owner *unstructured.Unstructured, a *app.App, replicas int32) *appsv1.Deployment {
	labels := map[string]string{app.Label: a.Name}
	var annotations map[string]string
	if a.Restart != "" {
		annotations = map[string]string{app.RestartedAnnotation: a.Restart}
	}
	image := a.Image
	if image == "" {
		image = s.Image
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: a.Deployment(), Namespace: a.Namespace(), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: owner.GetAPIVersion(), Kind: owner.GetKind(), Name: owner.GetName(), UID: owner.GetUID()}}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](5),
					Containers:                    []corev1.Container{{Name: "app", Image: image, Command: s.Command}},
				},
			},
		},
	}
}
