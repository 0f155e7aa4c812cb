package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Node roles: the server runs the control plane, a worker only workloads.
const (
	RoleServer = "server"
	RoleWorker = "worker"
)

// NodeRole says whether n is the server (k3s labels it control-plane, older releases master) or
// a worker.
func NodeRole(n *corev1.Node) string {
	for _, l := range []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"} {
		if _, ok := n.Labels[l]; ok {
			return RoleServer
		}
	}
	return RoleWorker
}

// RoleOrder sorts the server before workers.
func RoleOrder(role string) int {
	if role == RoleServer {
		return 0
	}
	return 1
}

// OutOfServiceTaint is the taint kip node fence puts on a fenced node.
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// JoiningTaint (NoSchedule) keeps ordinary workloads off a worker until kip node add has checked
// it: k3s registers the node with it, and kip lifts it once the checks pass. Longhorn's own pods
// tolerate it.
const JoiningTaint = "kipper.run/joining"

// JoiningToleration is the toleration of JoiningTaint.
var JoiningToleration = corev1.Toleration{Key: JoiningTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}

// Node states, as kip shows them.
const (
	NodeReady        = "Ready"
	NodeNotReady     = "NotReady"
	NodeUnknown      = "Unknown"
	NodeOutOfService = "OutOfService"
)

// NodeInfo is what kip shows of a Kubernetes node (kip status, kip node list).
type NodeInfo struct {
	Name string `json:"name"`
	// Role is server (the control plane) or worker.
	Role string `json:"role"`
	// Status is Ready, NotReady, Unknown or OutOfService (fenced: tainted
	// node.kubernetes.io/out-of-service; a fenced node never counts as Ready).
	Status string `json:"status"`
	// Unschedulable is a cordoned node.
	Unschedulable bool   `json:"unschedulable,omitempty"`
	K3sVersion    string `json:"k3sVersion"`
	InternalIP    string `json:"internalIP,omitempty"`
	ExternalIP    string `json:"externalIP,omitempty"`
}

// Info is what kip shows of n.
func Info(n *corev1.Node) NodeInfo {
	return NodeInfo{
		Name:          n.Name,
		Role:          NodeRole(n),
		Status:        NodeStatus(n),
		Unschedulable: n.Spec.Unschedulable,
		K3sVersion:    n.Status.NodeInfo.KubeletVersion,
		InternalIP:    NodeAddress(n, corev1.NodeInternalIP),
		ExternalIP:    NodeAddress(n, corev1.NodeExternalIP),
	}
}

// NodeStatus is n's state: OutOfService while fenced, else its Ready condition.
func NodeStatus(n *corev1.Node) string {
	if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == OutOfServiceTaint }) {
		return NodeOutOfService
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		switch c.Status {
		case corev1.ConditionTrue:
			return NodeReady
		case corev1.ConditionFalse:
			return NodeNotReady
		}
		return NodeUnknown
	}
	return NodeUnknown
}

// NodeAddress is n's first address of type typ, "" when it has none.
func NodeAddress(n *corev1.Node, typ corev1.NodeAddressType) string {
	for _, a := range n.Status.Addresses {
		if a.Type == typ {
			return a.Address
		}
	}
	return ""
}

// ServerNode is the cluster's server node (NodeRole).
func ServerNode(ctx context.Context, kc kubernetes.Interface) (*corev1.Node, error) {
	nodes, err := kc.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for i := range nodes.Items {
		if NodeRole(&nodes.Items[i]) == RoleServer {
			return &nodes.Items[i], nil
		}
	}
	return nil, errors.New("the cluster has no server node (no node is labelled node-role.kubernetes.io/control-plane)")
}
