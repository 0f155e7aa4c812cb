package app

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// PendingObserved says that console-api has not acted on the App's current spec yet, "" when it
// has (status.observedGeneration is its generation).
func (a *App) PendingObserved() string {
	if a.ObservedGeneration < a.Generation {
		return fmt.Sprintf("console-api has not acted on generation %d of the app yet (it last saw %d)", a.Generation, a.ObservedGeneration)
	}
	return ""
}

// StopPending says what is left before app ref is stopped, "" once it is: console-api has acted
// on its current spec, its Deployment is at 0 replicas (or gone), and no pod of it remains.
func StopPending(ctx context.Context, cl *kube.Clients, ref service.Ref) (string, error) {
	a, err := Get(ctx, cl.Dynamic, ref)
	if err != nil {
		return "", err
	}
	if !a.Stopped() {
		return "", fmt.Errorf("app %s was started again meanwhile", a.Ref)
	}
	if p := a.PendingObserved(); p != "" {
		return p, nil
	}
	d, err := GetDeployment(ctx, cl.Kube, a)
	if err != nil {
		return "", err
	}
	if d != nil && replicas(d) != 0 {
		return fmt.Sprintf("Deployment %s/%s is still set to %d replicas", d.Namespace, d.Name, replicas(d)), nil
	}
	pods, err := Pods(ctx, cl.Kube, a, d)
	if err != nil {
		return "", err
	}
	if len(pods) > 0 {
		return fmt.Sprintf("%d pods of the app are left, such as %s (%s)", len(pods), pods[0].Name, pods[0].Status.Phase), nil
	}
	return "", nil
}

// RunningPending says what is left before app ref runs as its spec says, "" once it does:
// console-api has acted on its current spec, its Deployment is set to the stored count (within
// the bounds while autoscaling is on), and the Deployment has rolled out: every pod of the
// current revision is Ready and none of an older one is left.
func RunningPending(ctx context.Context, cl *kube.Clients, ref service.Ref) (string, error) {
	a, err := Get(ctx, cl.Dynamic, ref)
	if err != nil {
		return "", err
	}
	if a.Stopped() {
		return "", fmt.Errorf("app %s was stopped meanwhile (%s)", a.Ref, a.Stop)
	}
	if p := a.PendingObserved(); p != "" {
		return p, nil
	}
	d, err := GetDeployment(ctx, cl.Kube, a)
	if err != nil || d == nil {
		return "Deployment " + a.Namespace() + "/" + a.Deployment() + " does not exist yet", err
	}
	n := replicas(d)
	switch b := a.Autoscale.Bounds(); {
	case a.Autoscale.Enabled && (n == 0 || !b.Holds(n)):
		return fmt.Sprintf("Deployment %s/%s is set to %d replicas, outside the app's bounds of %s", d.Namespace, d.Name, n, b), nil
	case !a.Autoscale.Enabled && n != a.Replicas:
		return fmt.Sprintf("Deployment %s/%s is set to %d replicas, not the app's stored %d", d.Namespace, d.Name, n, a.Replicas), nil
	}
	return rollout(d)
}

// RestartPending says what is left before the restart asked for at requested has rolled app
// ref's pods, "" once it has: console-api copied the request onto the Deployment's pod
// template, and the Deployment has rolled out.
func RestartPending(ctx context.Context, cl *kube.Clients, ref service.Ref, requested string) (string, error) {
	a, err := Get(ctx, cl.Dynamic, ref)
	if err != nil {
		return "", err
	}
	if a.Stopped() {
		return "", fmt.Errorf("app %s was stopped meanwhile (%s)", a.Ref, a.Stop)
	}
	d, err := GetDeployment(ctx, cl.Kube, a)
	if err != nil || d == nil {
		return "Deployment " + a.Namespace() + "/" + a.Deployment() + " does not exist yet", err
	}
	if got := d.Spec.Template.Annotations[RestartedAnnotation]; got != requested {
		return fmt.Sprintf("console-api has not put the restart of %s on Deployment %s/%s yet (its pods' %s is %q)",
			requested, d.Namespace, d.Name, RestartedAnnotation, got), nil
	}
	return rollout(d)
}

// rollout is what is left of d's rollout, as kube.WaitRollout judges it.
func rollout(d *appsv1.Deployment) (string, error) {
	done, pending, err := kube.RolloutStatus(d)
	if err != nil || done {
		return "", err
	}
	return pending, nil
}

// wait waits until pending reports nothing left.
func wait(ctx context.Context, timeout time.Duration, what string, pending func(context.Context) (string, error)) error {
	return kube.PollPending(ctx, timeout, what, pending)
}

// replicas is the Deployment's desired count (Kubernetes's default, 1, when unset).
func replicas(d *appsv1.Deployment) int32 { return ptr.Deref(d.Spec.Replicas, 1) }
