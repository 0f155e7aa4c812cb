package move

import (
	"context"
	"fmt"
	"sort"
	"strings"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
)

// detachPending says what keeps a Longhorn volume from being really detached: Longhorn's own
// state, an attachment ticket of any kind (a backup or snapshot controller keeps a volume
// attached after the CSI attacher let go), or the Kubernetes VolumeAttachment of its PV. ""
// means detached: the next mount is a fresh one (research: longhorn-velero.md §1).
func detachPending(ctx context.Context, cl *kube.Clients, pv, volume string) (string, error) {
	lh := cl.Longhorn.LonghornV1beta2()
	v, err := lh.Volumes(longhorn.Namespace).Get(ctx, volume, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read Longhorn volume %s: %w", volume, err)
	}
	if v.Status.State != longhornv1beta2.VolumeStateDetached {
		return fmt.Sprintf("Longhorn volume %s is %s", volume, orUnknown(string(v.Status.State))), nil
	}
	va, err := lh.VolumeAttachments(longhorn.Namespace).Get(ctx, volume, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("read Longhorn volume attachment %s: %w", volume, err)
	}
	if err == nil && len(va.Spec.AttachmentTickets) > 0 {
		var ids []string
		for id, t := range va.Spec.AttachmentTickets {
			ids = append(ids, fmt.Sprintf("%s (%s on %s)", id, t.Type, t.NodeID))
		}
		sort.Strings(ids)
		return fmt.Sprintf("Longhorn volume %s still has attachment tickets: %s", volume, strings.Join(ids, ", ")), nil
	}
	vas, err := cl.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list volume attachments: %w", err)
	}
	for _, a := range vas.Items {
		if a.Spec.Source.PersistentVolumeName != nil && *a.Spec.Source.PersistentVolumeName == pv {
			return fmt.Sprintf("VolumeAttachment %s still attaches %s to node %s", a.Name, pv, a.Spec.NodeName), nil
		}
	}
	return "", nil
}

// workloads are the pods Longhorn saw using a volume (status.kubernetesStatus.workloadsStatus).
func workloads(ctx context.Context, cl *kube.Clients, volume string) ([]string, error) {
	v, err := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).Get(ctx, volume, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read Longhorn volume %s: %w", volume, err)
	}
	var pods []string
	for _, w := range v.Status.KubernetesStatus.WorkloadsStatus {
		pods = append(pods, w.PodName)
	}
	return pods, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "in no state yet"
	}
	return s
}

func gibText(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
