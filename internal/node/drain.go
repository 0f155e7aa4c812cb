package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubectl/pkg/drain"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// Timeouts of a drain's waits.
const (
	drainTimeout = 10 * time.Minute // the worker's pods evicted and gone
	// detachTimeout bounds the wait, after a drain, for the worker's kubelet to unmount its
	// volumes and Kubernetes to detach them: longer than the 6 minutes after which Kubernetes
	// detaches a volume of a node that stopped reporting.
	detachTimeout = 7 * time.Minute
)

// drainer is the drain kip node remove and reboot run: every pod on the node evicted through the
// Eviction API (so PodDisruptionBudgets hold), its emptyDir data deleted with it, DaemonSet pods
// left, finished pods deleted; a pod no controller manages cancels the drain before anything is
// evicted, since nothing would start it again.
func drainer(ctx context.Context, cl *kube.Clients) *drain.Helper {
	return &drain.Helper{
		Ctx: ctx, Client: cl.Kube, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		Timeout: drainTimeout, Out: io.Discard, ErrOut: io.Discard,
	}
}

// checkPods refuses a node running pods a drain would delete for good: those no controller
// manages. It lists them as a forced drain would, so that it can name them.
func checkPods(ctx context.Context, cl *kube.Clients, node string) error {
	h := drainer(ctx, cl)
	h.Force = true
	list, errs := h.GetPodsForDeletion(node)
	if len(errs) > 0 {
		return fmt.Errorf("list the pods on %s: %w", node, errors.Join(errs...))
	}
	var unmanaged []string
	for _, p := range list.Pods() {
		if metav1.GetControllerOf(&p) == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			unmanaged = append(unmanaged, p.Namespace+"/"+p.Name)
		}
	}
	if len(unmanaged) == 0 {
		return nil
	}
	return fmt.Errorf("%s runs pods that no controller manages, which a drain would delete for good: %s; "+
		"delete them, or run them under a Deployment, StatefulSet or Job, then run the same command again", node, strings.Join(unmanaged, ", "))
}

// drainStep cordons node, evicts its pods (see drainer) and waits until its volumes have
// detached: a pod is gone before its kubelet has unmounted its volumes, and a reboot or wipe
// before that could lose what the file systems had not written, and leaves the volumes attached
// to the node, where their pods elsewhere cannot attach them.
func drainStep(cl *kube.Clients, name string) workflow.Step {
	return workflow.Step{
		Name: "drain", Title: "Drain " + name + " (DaemonSet pods stay, emptyDir data is deleted) and wait for its volumes to detach",
		Done: "Drained " + name, Already: name + " already drained",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil || !n.Spec.Unschedulable {
				return false, err
			}
			list, errs := drainer(ctx, cl).GetPodsForDeletion(name)
			if list == nil || len(errs) > 0 || len(list.Pods()) > 0 {
				return false, nil
			}
			attached, err := attachedTo(ctx, cl, name)
			return err == nil && len(attached) == 0, err
		},
		Apply: func(ctx context.Context) error {
			// A pod started since the command began is refused in kip's words, not kubectl's.
			if err := checkPods(ctx, cl, name); err != nil {
				return err
			}
			if err := cordon(ctx, cl, name, true); err != nil {
				return err
			}
			if err := drain.RunNodeDrain(drainer(ctx, cl), name); err != nil {
				return fmt.Errorf("drain %s: %w; see 'kubectl get pods -A -o wide --field-selector spec.nodeName=%s', then run the same command again", name, err, name)
			}
			err := kube.Poll(ctx, detachTimeout, "the volumes of "+name+" detached", func(ctx context.Context) (bool, string, error) {
				attached, err := attachedTo(ctx, cl, name)
				return err == nil && len(attached) == 0, "still attached: " + strings.Join(attached, ", "), err
			})
			if err != nil {
				return fmt.Errorf("%w: the kubelet on %s has not unmounted them yet; see 'kubectl get volumeattachments', then run the same command again", err, name)
			}
			return nil
		},
	}
}

// attachedTo names the volumes (their PersistentVolumes) Kubernetes has attached to node, or is
// attaching or detaching there, sorted.
func attachedTo(ctx context.Context, cl *kube.Clients, node string) ([]string, error) {
	vas, err := cl.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list volume attachments: %w", err)
	}
	var names []string
	for _, va := range vas.Items {
		if va.Spec.NodeName != node {
			continue
		}
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
			names = append(names, *pv)
		} else {
			names = append(names, va.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
