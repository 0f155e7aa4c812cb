package node

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/kube"
)

// updateNode changes the Node name on its latest version with change, again on a conflict (the
// kubelet and the node lifecycle controller write the Node too); change reports whether it
// changed anything. A Node that is gone is an error.
func updateNode(ctx context.Context, cl *kube.Clients, name string, change func(*corev1.Node) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || !change(n) {
			return err
		}
		_, err = cl.Kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{FieldManager: kube.FieldManager})
		return err
	})
}

// withoutTaint is taints without those of key.
func withoutTaint(taints []corev1.Taint, key string) []corev1.Taint {
	return slices.DeleteFunc(slices.Clone(taints), func(t corev1.Taint) bool { return t.Key == key })
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// cordon marks the node unschedulable (on) or schedulable again.
func cordon(ctx context.Context, cl *kube.Clients, node string, on bool) error {
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, on)
	if _, err := cl.Kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kip"}); err != nil {
		return fmt.Errorf("cordon %s: %w", node, err)
	}
	return nil
}

func ignoreFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
