package cluster

import corev1 "k8s.io/api/core/v1"

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
