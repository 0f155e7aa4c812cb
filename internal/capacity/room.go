package capacity

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Need is one pod a move runs on the node, or the service it starts again, by name and what it
// requests.
type Need struct {
	What     string // "the copy pod", "the verify pod", "the service"
	Requests corev1.ResourceList
}

// CheckRoom refuses when node would not keep room, CPU and memory separately, for the largest of
// needs once the pods in gone (the service's) are gone: room is the node's allocatable less the
// requests of the pods bound to it and of the pending pods that could be placed there (their
// node selector and required affinity match it and they tolerate its NoSchedule and NoExecute
// taints). It is a point-in-time check of requests, not a reservation.
func CheckRoom(node *corev1.Node, pods []corev1.Pod, gone []corev1.Pod, needs ...Need) error {
	used := Requested(node, pods, gone)
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		free := node.Status.Allocatable[r].DeepCopy()
		free.Sub(used[r])
		var most Need
		var want resource.Quantity
		for _, n := range needs {
			if q := n.Requests[r]; q.Cmp(want) > 0 {
				most, want = n, q
			}
		}
		if free.Cmp(want) < 0 {
			return fmt.Errorf("node %s has %s of %s free once the service's pods are gone (counting the pods waiting to be placed there), and %s needs %s: free room on the node first",
				node.Name, show(r, free), r, most.What, show(r, want))
		}
	}
	return nil
}

// Requested sums the requests of the pods bound to node and of the pending pods that could be
// placed there (couldRunOn), leaving out terminated pods and those in gone.
func Requested(node *corev1.Node, pods []corev1.Pod, gone []corev1.Pod) corev1.ResourceList {
	goneUID := map[string]bool{}
	for _, p := range gone {
		goneUID[string(p.UID)] = true
	}
	used := corev1.ResourceList{}
	for i := range pods {
		p := &pods[i]
		if terminal(p) || goneUID[string(p.UID)] || !(p.Spec.NodeName == node.Name || p.Spec.NodeName == "" && couldRunOn(p, node)) {
			continue
		}
		for n, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}) {
			sum := used[n]
			sum.Add(q)
			used[n] = sum
		}
	}
	return used
}

// couldRunOn reports whether a pending pod's node selector, required node affinity and
// tolerations let the scheduler place it on node.
func couldRunOn(p *corev1.Pod, node *corev1.Node) bool {
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(node); err != nil || !ok {
		return false
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, p.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	return !untolerated
}

// show is a quantity as an operator reads it: CPU in millicores, memory in MiB.
func show(r corev1.ResourceName, q resource.Quantity) string {
	if r == corev1.ResourceCPU {
		return fmt.Sprintf("%dm", q.MilliValue())
	}
	return fmt.Sprintf("%d MiB", q.Value()>>20)
}
