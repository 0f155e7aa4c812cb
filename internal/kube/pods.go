package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons the kubelet gives a container that cannot start and will not by waiting: it crashed
// and is backing off, its image cannot be pulled after a retry, or its configuration is wrong.
// ErrImagePull alone is not one: the kubelet's first pull failure, which a retry may cure.
var cannotStart = map[string]bool{
	"CrashLoopBackOff":           true,
	"ImagePullBackOff":           true,
	"InvalidImageName":           true,
	"ErrImageNeverPull":          true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
	"RunContainerError":          true,
}

// PodProblem says why a pod cannot start, "" when nothing says it cannot: a container (init or
// regular) waiting for a reason waiting does not cure, with the kubelet's message and how it last
// ended, or a pod the kubelet failed.
func PodProblem(pod *corev1.Pod) string {
	if pod.Status.Phase == corev1.PodFailed {
		return "it failed: " + orNone(pod.Status.Reason+" "+pod.Status.Message)
	}
	statuses := append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, st := range statuses {
		w := st.State.Waiting
		if w == nil || !cannotStart[w.Reason] {
			continue
		}
		why := fmt.Sprintf("container %s is in %s", st.Name, w.Reason)
		if w.Message != "" {
			why += " (" + w.Message + ")"
		}
		if t := st.LastTerminationState.Terminated; t != nil {
			why += fmt.Sprintf("; it last exited with code %d", t.ExitCode)
			if t.Reason != "" {
				why += " (" + t.Reason + ")"
			}
			if msg := strings.TrimSpace(t.Message); msg != "" {
				why += ": " + msg
			}
		}
		return why
	}
	return ""
}

func orNone(s string) string {
	if s = strings.TrimSpace(s); s == "" {
		return "no reason given"
	}
	return s
}

// revisionAnnotation is the Deployment controller's revision, on a Deployment and its
// ReplicaSets.
const revisionAnnotation = "deployment.kubernetes.io/revision"

// ServingAlone reports whether the Deployment namespace/name has rolled out (RolloutStatus) and
// every pod it selects, terminating ones included, belongs to its current revision: what
// kubectl rollout status does not wait for, since a finished rollout can leave an old pod
// terminating. A pod of the current revision that cannot start (PodProblem) is an error naming
// it: a rollout keeps the old pod serving while the new one fails, so waiting longer would only
// hide the failure.
func ServingAlone(ctx context.Context, c *Clients, namespace, name string) (done bool, pending string, err error) {
	d, err := c.Kube.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		pending, err := PendingGet("Deployment "+namespace+"/"+name, err)
		return false, pending, err
	}
	if d.Generation > d.Status.ObservedGeneration {
		// Until the controller has seen the latest spec, its revision and pods are the last one's:
		// a pod of that revision failing says nothing about the new one.
		return false, fmt.Sprintf("Deployment %s/%s: spec update not yet observed (generation %d, observed %d)", namespace, name, d.Generation, d.Status.ObservedGeneration), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return false, "", fmt.Errorf("Deployment %s/%s: %w", namespace, name, err)
	}
	opts := metav1.ListOptions{LabelSelector: sel.String()}
	sets, err := c.Kube.AppsV1().ReplicaSets(namespace).List(ctx, opts)
	if err != nil {
		pending, err := PendingGet("the ReplicaSets of Deployment "+namespace+"/"+name, err)
		return false, pending, err
	}
	hash := currentHash(d, sets.Items)
	pods, err := c.Kube.CoreV1().Pods(namespace).List(ctx, opts)
	if err != nil {
		pending, err := PendingGet("the pods of Deployment "+namespace+"/"+name, err)
		return false, pending, err
	}
	var old []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if hash == "" || p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != hash {
			old = append(old, p.Name)
			continue
		}
		if why := PodProblem(p); why != "" {
			return false, "", fmt.Errorf("Deployment %s/%s's new pod %s cannot start: %s", namespace, name, p.Name, why)
		}
	}
	done, pending, err = RolloutStatus(d)
	if err != nil || !done {
		return false, pending, err
	}
	if hash == "" {
		return false, fmt.Sprintf("Deployment %s/%s: its current ReplicaSet (revision %s) is not there yet", namespace, name, d.Annotations[revisionAnnotation]), nil
	}
	if len(old) > 0 {
		return false, fmt.Sprintf("Deployment %s/%s has rolled out, but pods of an earlier revision remain: %s", namespace, name, strings.Join(old, ", ")), nil
	}
	return true, "", nil
}

// currentHash is the pod-template-hash of d's ReplicaSet of d's current revision, "" when there
// is none yet.
func currentHash(d *appsv1.Deployment, sets []appsv1.ReplicaSet) string {
	rev := d.Annotations[revisionAnnotation]
	if rev == "" {
		return ""
	}
	for _, rs := range sets {
		if rs.Annotations[revisionAnnotation] == rev && metav1.IsControlledBy(&rs, d) {
			return rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
		}
	}
	return ""
}

// WaitServingAlone waits until ServingAlone holds for the Deployment namespace/name.
func WaitServingAlone(ctx context.Context, c *Clients, namespace, name string, timeout time.Duration) error {
	return Poll(ctx, timeout, "Deployment "+namespace+"/"+name+" to serve alone on its new pods", func(ctx context.Context) (bool, string, error) {
		return ServingAlone(ctx, c, namespace, name)
	})
}
