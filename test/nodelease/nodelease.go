// Package nodelease renews a Node's Lease in kube-node-lease as a kubelet does, so that the node
// lifecycle controller counts the Node alive. The k3s stand-in's kubelet and the test
// environment's Ready nodes share it.
package nodelease

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Kubelet's defaults: a 40 s Lease renewed every 10 s.
const (
	Duration = 40 * time.Second
	Interval = 10 * time.Second
)

// Renew creates or renews node's Lease, owned by the Node when it exists, as held now.
func Renew(ctx context.Context, kube kubernetes.Interface, node string) error {
	leases := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(node),
				LeaseDurationSeconds: ptr.To(int32(Duration.Seconds())),
				RenewTime:            &now,
			},
		}
		if n, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr.To(node)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(Duration.Seconds()))
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}
