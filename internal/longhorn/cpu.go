package longhorn

import (
	"fmt"
	"math"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"kipper.run/kip/internal/capacity"
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
func CPU(node *corev1.Node) int64 {
	a := node.Status.Allocatable[corev1.ResourceCPU]
	return int64(math.Round(float64(a.MilliValue()) * CPUPercent / 100))
}

// CheckCPU refuses when node would not have Longhorn's CPU free after the requests of the
// pods bound to it and of the pending pods that could be placed there. The refusal suggests, when
// lowering the CPU requests of the Kipper services on the node (services) can make the room,
// which services to lower, to what, with the command that does it.
func CheckCPU(node *corev1.Node, pods []corev1.Pod, services []ServiceCPU) error {
	requested := capacity.Requested(node, pods, nil)[corev1.ResourceCPU]
	a := node.Status.Allocatable[corev1.ResourceCPU]
	need, free := CPU(node), a.MilliValue()-requested.MilliValue()
	if free >= need {
		return nil
	}
	deficit := need - free
	msg := fmt.Sprintf("node %s has %dm of CPU free after the requests of its pods and of the pods waiting to be placed there, "+
		"and Longhorn's storage engine requests %d%% of its allocatable CPU, %dm; a service could fail to restart after its move",
		node.Name, max(free, 0), CPUPercent, need)
	if s := suggestCPU(services, deficit); s != "" {
		return fmt.Errorf("%s: %s, or give the node more CPU", msg, s)
	}
	return fmt.Errorf("%s: give the node more CPU, or lower the CPU requests of the pods on it", msg)
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
