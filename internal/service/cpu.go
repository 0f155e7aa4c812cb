package service

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
)

// CPUByNode is, by node, the Kipper services whose pods run there, with their declared CPU
// requests.
func CPUByNode(ctx context.Context, cl *kube.Clients, pods []corev1.Pod) (map[string][]longhorn.ServiceCPU, error) {
	svcs, err := List(ctx, cl.Dynamic, cl.Kube)
	if err != nil {
		return nil, err
	}
	out := map[string][]longhorn.ServiceCPU{}
	for _, svc := range svcs {
		q, err := resource.ParseQuantity(svc.Resources.CPURequest)
		if err != nil {
			continue // no CPU request to lower
		}
		for _, p := range pods {
			if p.Namespace == svc.Namespace() && p.Labels[Label] == svc.Name && p.Spec.NodeName != "" {
				out[p.Spec.NodeName] = append(out[p.Spec.NodeName], longhorn.ServiceCPU{Name: svc.Name, Namespace: svc.Namespace(),
					Project: svc.Project, Environment: svc.Environment, Request: q})
				break
			}
		}
	}
	return out, nil
}
