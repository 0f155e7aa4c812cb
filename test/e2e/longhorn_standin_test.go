package e2e_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/longhorn-standin/standin"
)

// longhornStandinHost is the Longhorn stand-in test's host (index 8, lab9).
const longhornStandinHost = 8

// TestLonghornStandin runs the lab's Longhorn stand-in (docs/longhorn-standin.md) on a stand-in
// server: a claim of class longhorn provisioned through the real external-provisioner, attached
// through the real external-attacher and the kubelet, with Longhorn's objects as Longhorn keeps
// them; a file written by one pod and read by a read-only pod after the volume detached (a fresh
// mount of the image, not the page cache); expansion seen by a pod, and ENOSPC past the size; a
// claim too big for the disk refused; a plain value of a per-data-engine setting rewritten;
// deletion removing the data and the objects; and no loop device left bound on this machine.
func TestLonghornStandin(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	h := s.Own(t, longhornStandinHost)[0]
	e2e.LogK3sOnFailure(t, h)
	standin.LogOnFailure(t, h)
	if err := s.InstallStandin(ctx, h, "server", e2e.ServerConfig(h)); err != nil {
		t.Fatal(err)
	}
	_, _, c := s.Clients(ctx, t, h, h.Name)
	var volumes []string // the test's volumes, which no loop device may be left bound to
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		detached, err := standin.Uninstall(ctx, h)
		if err != nil {
			t.Error(err)
		}
		if len(detached) > 0 {
			t.Errorf("loop devices still bound after the stand-in stopped (detached now): %v", detached)
		}
		for n, file := range loop.Backing(loop.SysBlock) {
			for _, v := range volumes {
				if strings.Contains(file, v) {
					t.Errorf("/dev/loop%d is still bound to %s", n, file)
				}
			}
		}
	})
	start := time.Now()
	if err := standin.Install(ctx, h, c); err != nil {
		t.Fatal(err)
	}
	t.Logf("Longhorn stand-in installed and registered in %s", time.Since(start).Round(100*time.Millisecond))
	lhc := c.Longhorn.LonghornV1beta2()

	// The lab host's data path is on this machine's disk, shared with everything else: Longhorn's
	// 25% kept free is not this test's to promise, so the setting goes to 0 (a real setting).
	setSetting(ctx, t, c, "storage-minimal-available-percentage", "0")
	// kip writes its pins as plain values; Longhorn's webhook stores a per-engine one as JSON.
	setSetting(ctx, t, c, "fast-replica-rebuild-enabled", "false")
	if err := poll(ctx, time.Minute, "fast-replica-rebuild-enabled rewritten", func(ctx context.Context) (bool, error) {
		st, err := lhc.Settings(standin.Namespace).Get(ctx, "fast-replica-rebuild-enabled", metav1.GetOptions{})
		return err == nil && st.Value == `{"v1":"false","v2":"false"}` && st.Status.Applied, err
	}); err != nil {
		t.Fatal(err)
	}

	node, err := lhc.Nodes(standin.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var disk *lh.DiskStatus
	for _, d := range node.Status.DiskStatus {
		disk = d
	}
	if len(node.Spec.Disks) != 1 || disk == nil || disk.StorageMaximum <= 0 || disk.StorageAvailable <= 0 || disk.DiskPath != standin.DataPath+"/" {
		t.Fatalf("Longhorn node %s: disks %+v, status %+v", h.Name, node.Spec.Disks, disk)
	}

	// A claim bigger than the disk is refused, as Longhorn's scheduler refuses it.
	tooBig := resource.NewQuantity(2*disk.StorageMaximum, resource.BinarySI).String()
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, standin.Claim("too-big", "default", tooBig), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, "too-big refused", func(ctx context.Context) (bool, error) {
		evs, err := c.Kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=too-big,reason=ProvisioningFailed"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "ResourceExhausted") {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Kube.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "too-big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	vol, err := standin.CreateClaim(ctx, c, "data", "default", "64Mi")
	if err != nil {
		t.Fatal(err)
	}
	volumes = append(volumes, vol)
	v := waitVolume(ctx, t, c, vol, lh.VolumeStateDetached)
	if v.Spec.Size != 64<<20 || v.Spec.NumberOfReplicas != 3 || v.Status.Robustness != lh.VolumeRobustnessUnknown ||
		v.Status.KubernetesStatus.PVCName != "data" || v.Status.KubernetesStatus.Namespace != "default" {
		t.Errorf("new volume %s: size %d, %d replicas, robustness %s, kubernetes status %+v", vol, v.Spec.Size, v.Spec.NumberOfReplicas, v.Status.Robustness, v.Status.KubernetesStatus)
	}
	if _, err := os.Stat(standin.Image(h, vol)); err != nil {
		t.Fatalf("volume %s has no image on %s: %v", vol, h.Name, err)
	}
	// The node's disk counts the copy scheduled on it; the volume follows its PV.
	if err := poll(ctx, time.Minute, "volume "+vol+" on its node's disk and following its PV", func(ctx context.Context) (bool, error) {
		n, err := lhc.Nodes(standin.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		v, err := lhc.Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range n.Status.DiskStatus {
			if d.StorageScheduled == 64<<20 && v.Status.KubernetesStatus.PVStatus == string(corev1.VolumeBound) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error(err)
	}

	// A pod writes a file and stays until deleted: attached meanwhile, with Longhorn's ticket.
	const content = "written through driver.longhorn.io"
	writer := podOn("writer", "", "echo '"+content+"' > /data/hello && sync && echo written && trap 'exit 0' TERM && while :; do sleep 1; done")
	mountClaim(writer, "data", false)
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, writer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 3*time.Minute, "writer's file written", func(ctx context.Context) (bool, error) {
		p, err := c.Kube.CoreV1().Pods("default").Get(ctx, "writer", metav1.GetOptions{})
		if err != nil || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, err
		}
		return strings.Contains(podLog(ctx, c, "writer"), "written"), nil
	}); err != nil {
		t.Fatal(err)
	}
	v = waitVolume(ctx, t, c, vol, lh.VolumeStateAttached)
	ticket := ticketID(vol, h.Name)
	va, err := lhc.VolumeAttachments(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tk := va.Spec.AttachmentTickets[ticket]; tk == nil || tk.Type != lh.AttacherTypeCSIAttacher || tk.NodeID != h.Name ||
		va.Status.AttachmentTicketStatuses[ticket] == nil || !va.Status.AttachmentTicketStatuses[ticket].Satisfied {
		t.Errorf("attached volume %s: tickets %v, statuses %v; want the satisfied csi-attacher ticket %s", vol, va.Spec.AttachmentTickets, va.Status.AttachmentTicketStatuses, ticket)
	}
	if _, err := c.Kube.StorageV1().VolumeAttachments().Get(ctx, ticket, metav1.GetOptions{}); err != nil {
		t.Errorf("Kubernetes' VolumeAttachment is not named as Longhorn's ticket %s: %v", ticket, err)
	}
	// Three copies wanted, one node: Longhorn reports such a volume degraded while attached.
	if v.Status.CurrentNodeID != h.Name || v.Status.Robustness != lh.VolumeRobustnessDegraded {
		t.Errorf("attached volume %s: node %q, robustness %s", vol, v.Status.CurrentNodeID, v.Status.Robustness)
	}
	if !boundLoop(vol) {
		t.Errorf("no loop device bound to %s's image while it is attached", vol)
	}
	engine, err := lhc.Engines(standin.Namespace).Get(ctx, vol+"-e-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if engine.Status.CurrentState != lh.InstanceStateRunning || engine.Spec.NodeID != h.Name || len(engine.Status.ReplicaModeMap) != 1 {
		t.Errorf("engine of attached volume %s: %s on %q, replica modes %v; want running on %s with its copy RW", vol, engine.Status.CurrentState, engine.Spec.NodeID, engine.Status.ReplicaModeMap, h.Name)
	}
	for r, mode := range engine.Status.ReplicaModeMap {
		if mode != lh.ReplicaModeRW {
			t.Errorf("engine of attached volume %s: replica %s is %s", vol, r, mode)
		}
	}
	deletePod(ctx, t, c, "writer")
	waitDetached(ctx, t, c, vol, ticket)
	checkReplicas(ctx, t, c, vol, h.Name)

	// A read-only pod reads the file from a fresh mount and cannot write.
	reader := podOn("reader", "", `[ "$(cat /data/hello)" = '`+content+`' ] || { echo "read: $(cat /data/hello)"; exit 1; }
if touch /data/new 2>/tmp/err; then echo "wrote to a read-only volume"; exit 1; fi
grep -q 'Read-only file system' /tmp/err || { cat /tmp/err; exit 1; }`)
	mountClaim(reader, "data", true)
	runPod(ctx, t, c, reader)
	waitDetached(ctx, t, c, vol, ticket)

	// Expansion: the claim grows; a pod sees the file system's new size and fills it to ENOSPC.
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`)
	if _, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The resizer has expanded the volume (ControllerExpandVolume) and left the file system to the
	// kubelet: when a pod next mounts the claim, the stage grows it (offline: a lab host cannot
	// resize a mounted ext4) and NodeExpandVolume reports it grown.
	if err := poll(ctx, 2*time.Minute, "claim data pending its file system's expansion", func(ctx context.Context) (bool, error) {
		pvc, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimNodeResizePending, nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, err := lhc.Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{}); err != nil || v.Spec.Size != 128<<20 {
		t.Fatalf("volume %s after the controller's expansion: %v, %v", vol, v, err)
	}
	grown := podOn("grown", "", `kb=$(df -k /data | awk 'NR==2 {print $2}')
[ "$kb" -gt 100000 ] || { echo "file system of $kb KiB"; exit 1; }
[ "$(cat /data/hello)" = '`+content+`' ] || { echo "lost the file"; exit 1; }
if dd if=/dev/zero of=/data/fill bs=1M count=200 2>/tmp/err; then echo "wrote 200 MiB to a 128 MiB volume"; exit 1; fi
grep -q 'No space left on device' /tmp/err || { cat /tmp/err; exit 1; }
echo "file system of $kb KiB"`)
	mountClaim(grown, "data", false)
	runPod(ctx, t, c, grown)
	if err := poll(ctx, 2*time.Minute, "claim data at 128Mi", func(ctx context.Context) (bool, error) {
		pvc, err := c.Kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
		return err == nil && pvc.Status.Capacity.Storage().Cmp(resource.MustParse("128Mi")) == 0, err
	}); err != nil {
		t.Error(err)
	}
	waitDetached(ctx, t, c, vol, ticket)

	// Deleting the claim deletes the volume: its image and Longhorn's objects.
	if err := c.Kube.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 2*time.Minute, "volume "+vol+" deleted", func(ctx context.Context) (bool, error) {
		_, err := lhc.Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, unlessNotFound(err)
		}
		reps, err := lhc.Replicas(standin.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol})
		return err == nil && len(reps.Items) == 0, err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(standin.Image(h, vol))); !os.IsNotExist(err) {
		t.Errorf("volume %s deleted, its data left on %s: %v", vol, h.Name, err)
	}
}

// unlessNotFound keeps an API error other than NotFound, which ends a poll.
func unlessNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func ticketID(vol, node string) string {
	sum := sha256.Sum256([]byte(vol + standin.Driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

func setSetting(ctx context.Context, t testing.TB, c *kube.Clients, name, value string) {
	t.Helper()
	// The stand-in writes its settings too (their status): the change is made on the latest
	// object, again on a conflict.
	api := c.Longhorn.LonghornV1beta2().Settings(standin.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		st, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st.Value = value
		_, err = api.Update(ctx, st, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mountClaim(p *corev1.Pod, name string, readOnly bool) {
	src := claim(name)
	src.PersistentVolumeClaim.ReadOnly = readOnly
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: src})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data", ReadOnly: readOnly})
}

// runPod runs p to success and deletes it.
func runPod(ctx context.Context, t *testing.T, c *kube.Clients, p *corev1.Pod) {
	t.Helper()
	if _, err := c.Kube.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, p.Name, corev1.PodSucceeded, 3*time.Minute)
	t.Logf("pod %s: %s", p.Name, podLog(ctx, c, p.Name))
	deletePod(ctx, t, c, p.Name)
}

func waitVolume(ctx context.Context, t *testing.T, c *kube.Clients, name string, state lh.VolumeState) *lh.Volume {
	t.Helper()
	var v *lh.Volume
	if err := poll(ctx, 2*time.Minute, "volume "+name+" "+string(state), func(ctx context.Context) (bool, error) {
		var err error
		v, err = c.Longhorn.LonghornV1beta2().Volumes(standin.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && v.Status.State == state, unlessNotFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// waitDetached waits until the volume is detached as kip judges it (research: state detached,
// no ticket in Longhorn's VolumeAttachment, no Kubernetes VolumeAttachment), and checks that no
// loop device is bound to its image: the next mount reads the image afresh.
func waitDetached(ctx context.Context, t *testing.T, c *kube.Clients, vol, ticket string) {
	t.Helper()
	if err := poll(ctx, 2*time.Minute, "volume "+vol+" detached", func(ctx context.Context) (bool, error) {
		if _, err := c.Kube.StorageV1().VolumeAttachments().Get(ctx, ticket, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, unlessNotFound(err)
		}
		va, err := c.Longhorn.LonghornV1beta2().VolumeAttachments(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
		if err != nil || len(va.Spec.AttachmentTickets) > 0 {
			return false, err
		}
		v, err := c.Longhorn.LonghornV1beta2().Volumes(standin.Namespace).Get(ctx, vol, metav1.GetOptions{})
		return err == nil && v.Status.State == lh.VolumeStateDetached && v.Status.Robustness == lh.VolumeRobustnessUnknown && v.Status.CurrentNodeID == "", err
	}); err != nil {
		t.Fatal(err)
	}
	if boundLoop(vol) {
		t.Errorf("volume %s detached, a loop device still bound to its image: %v", vol, loop.Backing(loop.SysBlock))
	}
}

// boundLoop reports whether a loop device on this machine is bound to the image of a copy of the
// volume (its path as the host sees it, or as this machine does).
func boundLoop(vol string) bool {
	for _, file := range loop.Backing(loop.SysBlock) {
		if strings.Contains(file, "/replicas/"+vol+"-") {
			return true
		}
	}
	return false
}

// checkReplicas checks the volume's copies: one per copy wanted, one on node with healthyAt and
// lastHealthyAt set since it was RW (RFC3339 UTC at one-second precision), the others without a
// node.
func checkReplicas(ctx context.Context, t *testing.T, c *kube.Clients, vol, node string) {
	t.Helper()
	reps, err := c.Longhorn.LonghornV1beta2().Replicas(standin.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol})
	if err != nil {
		t.Fatal(err)
	}
	onNode := 0
	for _, r := range reps.Items {
		if r.Spec.NodeID == "" {
			continue
		}
		onNode++
		for _, at := range []string{r.Spec.HealthyAt, r.Spec.LastHealthyAt} {
			ts, err := time.Parse(time.RFC3339, at)
			if err != nil || ts.Location() != time.UTC || ts.Nanosecond() != 0 || !strings.HasSuffix(at, "Z") {
				t.Errorf("replica %s: healthyAt %q, lastHealthyAt %q: want RFC3339 UTC seconds", r.Name, r.Spec.HealthyAt, r.Spec.LastHealthyAt)
			}
		}
		if r.Spec.NodeID != node || r.Spec.FailedAt != "" {
			t.Errorf("replica %s: node %q, failedAt %q", r.Name, r.Spec.NodeID, r.Spec.FailedAt)
		}
	}
	if len(reps.Items) != 3 || onNode != 1 {
		t.Errorf("volume %s: %d replicas, %d on a node; want 3, one on %s", vol, len(reps.Items), onNode, node)
	}
}
