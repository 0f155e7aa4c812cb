package longhorn

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/capacity"
	"kipper.run/kip/internal/kube"
)

// CPUPercent is the share of every node's allocatable CPU that Longhorn's instance manager
// requests (its guaranteed-instance-manager-cpu setting, 12 by default).
const CPUPercent = 12

// minServiceCPU is the lowest CPU request kip suggests for a service.
const minServiceCPU = 10

// ServiceCPU is a Kipper service's CPU request on a node, as its Service declares it.
type ServiceCPU struct {
	Name, Namespace, Project, Environment string
	Request                               resource.Quantity
}

// CPU is the CPU Longhorn's engine requests on node: CPUPercent of its
// allocatable millicores, rounded as Longhorn rounds it.
func CPU(node *corev1.Node) int64 { return ManagerCPU(node, 0, CPUPercent) }

// ManagerCPU is the CPU (millicores) an instance manager requests on node, as Longhorn's
// manager sets it: the Longhorn Node's instanceManagerCPURequest when positive, else percent
// (guaranteed-instance-manager-cpu) of the node's allocatable CPU, rounded.
func ManagerCPU(node *corev1.Node, nodeRequest int64, percent float64) int64 {
	if nodeRequest > 0 {
		return nodeRequest
	}
	a := node.Status.Allocatable[corev1.ResourceCPU]
	return int64(math.Round(float64(a.MilliValue()) * percent / 100))
}

// CheckCPU refuses when node would not have Longhorn's CPU free after the requests of the
// pods bound to it and of the pending pods that could be placed there. The refusal suggests, when
// lowering the CPU requests of the Kipper services on the node (services) can make the room,
// which services to lower, to what, with the command that does it.
func CheckCPU(node *corev1.Node, pods []corev1.Pod, services []ServiceCPU) error {
	free, deficit := cpuDeficit(node, pods, CPU(node))
	if deficit <= 0 {
		return nil
	}
	msg := fmt.Sprintf("node %s has %dm of CPU free after the requests of its pods and of the pods waiting to be placed there, "+
		"and Longhorn's storage engine requests %d%% of its allocatable CPU, %dm; a service could fail to restart after its move",
		node.Name, free, CPUPercent, CPU(node))
	return fmt.Errorf("%s: %s", msg, cpuFix(services, deficit))
}

// cpuDeficit is node's CPU free after the requests of the pods bound to it and of the pending
// pods that could be placed there (shown never below 0), and how much more need takes (counting
// what the requests already overcommit).
func cpuDeficit(node *corev1.Node, pods []corev1.Pod, need int64) (free, deficit int64) {
	requested := capacity.Requested(node, pods, nil)[corev1.ResourceCPU]
	a := node.Status.Allocatable[corev1.ResourceCPU]
	left := a.MilliValue() - requested.MilliValue()
	return max(left, 0), need - left
}

// cpuFix says how to free deficit millicores on a node: which of its Kipper services to lower
// when that is enough, else more CPU.
func cpuFix(services []ServiceCPU, deficit int64) string {
	if s := suggestCPU(services, deficit); s != "" {
		return s + ", or give the node more CPU"
	}
	return "give the node more CPU, or lower the CPU requests of the pods on it"
}

// suggestCPU lowers the largest requests first, each to no less than minServiceCPU, until deficit
// millicores are free; "" when the services cannot free that much.
func suggestCPU(services []ServiceCPU, deficit int64) string {
	sorted := append([]ServiceCPU(nil), services...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Request.MilliValue() > sorted[j].Request.MilliValue() })
	var out []string
	for _, s := range sorted {
		if deficit <= 0 {
			break
		}
		r := s.Request.MilliValue()
		cut := min(deficit, r-minServiceCPU)
		if cut <= 0 {
			continue
		}
		to := fmt.Sprintf("%dm", r-cut)
		out = append(out, fmt.Sprintf("Lower %s in %s from %dm to %s with 'kip service update %s --cpu %s --project %s --environment %s'",
			s.Name, s.Namespace, r, to, s.Name, to, s.Project, s.Environment))
		deficit -= cut
	}
	if deficit > 0 {
		return ""
	}
	return strings.Join(out, ", and ")
}

// Longhorn's instance managers: their pods' label, and the setting that sizes them.
const (
	instanceManagerComponent, instanceManagerValue = "longhorn.io/component", "instance-manager"
	settingManagerCPU                              = "guaranteed-instance-manager-cpu"
)

// CheckManagerCPU is spec 002's CPU check before a step onto next: during the step Longhorn starts
// another instance manager on every node, requesting ManagerCPU there, while the old one keeps
// its reservation until no volume uses it; a node without that much CPU unrequested would refuse
// the new manager's pod (the kubelet admits it by its requests) and the step would time out. It
// names each such node (pods: every pod of the cluster), what keeps its CPU (an older instance manager's reservation among it),
// and which Kipper services on it to lower (services, by node) or more CPU. Nodes where the new
// manager's pod is already admitted are skipped.
func CheckManagerCPU(ctx context.Context, cl *kube.Clients, next Release, pods []corev1.Pod, services map[string][]ServiceCPU) ([]string, error) {
	percent := float64(CPUPercent) // a float in Longhorn's setting: 12.5 is a value
	if s, err := cl.Longhorn.LonghornV1beta2().Settings(Namespace).Get(ctx, settingManagerCPU, metav1.GetOptions{}); err == nil {
		if n, err := strconv.ParseFloat(v1Value(s.Value), 64); err == nil {
			percent = n
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read Longhorn setting %s: %w", settingManagerCPU, err)
	}
	lhNodes, err := cl.Longhorn.LonghornV1beta2().Nodes(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's nodes: %w", err)
	}
	nodes, err := cl.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the cluster's nodes: %w", err)
	}
	var out []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		li := slices.IndexFunc(lhNodes.Items, func(l longhornv1beta2.Node) bool { return l.Name == n.Name })
		if li < 0 {
			continue // Longhorn runs no instance manager there
		}
		var older []string
		admitted := false
		for _, p := range pods {
			if p.Namespace != Namespace || p.Labels[instanceManagerComponent] != instanceManagerValue || p.Spec.NodeName != n.Name || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			if slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return strings.HasSuffix(c.Image, ":"+next.Version) }) {
				admitted = true
				continue
			}
			var cpu int64
			for _, c := range p.Spec.Containers {
				cpu += c.Resources.Requests.Cpu().MilliValue()
			}
			older = append(older, fmt.Sprintf("%s (%dm)", p.Name, cpu))
		}
		if admitted {
			continue
		}
		need := ManagerCPU(n, int64(lhNodes.Items[li].Spec.InstanceManagerCPURequest), percent)
		free, deficit := cpuDeficit(n, pods, need)
		if deficit <= 0 {
			continue
		}
		msg := fmt.Sprintf("node %s has %dm of CPU unrequested, and Longhorn %s's new instance manager requests %dm there", n.Name, free, next.Version, need)
		if len(older) > 0 {
			msg += fmt.Sprintf("; its older instance manager %s keeps its reservation until no volume uses it", strings.Join(older, ", "))
		}
		out = append(out, msg+": "+cpuFix(services[n.Name], deficit))
	}
	return out, nil
}
