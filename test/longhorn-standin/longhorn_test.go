package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	lhfake "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned/fake"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"kipper.run/kip/test/longhorn-standin/manager"
	"kipper.run/kip/test/need"
)

func TestTicketIDAndSizes(t *testing.T) {
	id := ticketID("pvc-1", "lab9")
	if !regexp.MustCompile(`^csi-[0-9a-f]{64}$`).MatchString(id) || id == ticketID("pvc-1", "lab8") {
		t.Errorf("ticketID = %q", id)
	}
	for in, want := range map[int64]int64{0: 2 << 20, 1: 2 << 20, 2 << 20: 2 << 20, 64 << 20: 64 << 20, 65<<20 + 1: 66 << 20} {
		if got := roundUp(in); got != want {
			t.Errorf("roundUp(%d) = %d, want %d", in, got, want)
		}
	}
	if got := unescape(`/var/lib/kubelet/a\040b`); got != "/var/lib/kubelet/a b" {
		t.Errorf("unescape = %q", got)
	}
	if _, err := time.Parse(time.RFC3339, manager.Now()); err != nil || len(manager.Now()) != len("2006-01-02T15:04:05Z") {
		t.Errorf("manager.Now() = %q: %v", manager.Now(), err)
	}
}

// TestVolumeLifecycle runs a volume through the stand-in's objects against fake API clients, with
// its image in a temporary data path: created detached with its copies, attached with the
// csi-attacher ticket and its copy healthy, detached with no ticket, refused when too big,
// expanded, deleted; and a plain value of a per-engine setting rewritten by a reconcile pass.
func TestVolumeLifecycle(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		need.Missing(t, "mkfs.ext4 not found (make test-deps installs e2fsprogs)")
	}
	ctx := context.Background()
	s := &store{lh: lhfake.NewSimpleClientset(), kube: kubefake.NewClientset(), node: "lab9", root: t.TempDir()}
	if err := s.setUp(ctx); err != nil {
		t.Fatal(err)
	}
	// The temporary data path is on this machine's disk, whose free share is not the test's.
	minimal, _ := s.lh.LonghornV1beta2().Settings(namespace).Get(ctx, manager.SettingMinimalAvailable, metav1.GetOptions{})
	minimal.Value = "0"
	if _, err := s.lh.LonghornV1beta2().Settings(namespace).Update(ctx, minimal, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	self, err := s.lh.LonghornV1beta2().Nodes(namespace).Get(ctx, "lab9", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	room, err := s.room(ctx, self)
	if err != nil || room < 64<<20 {
		t.Fatalf("room in %s for volumes: %d bytes, %v", s.root, room, err)
	}
	// The room follows the free space of this machine's disk, which other tests change meanwhile:
	// a volume over it asks for a TiB more.
	if _, err := s.createVolume(ctx, "too-big", roundUp(room+1<<40), nil); !errors.Is(err, errNoRoom) {
		t.Fatalf("a volume over the room (%d bytes): %v", room, err)
	}
	p := &plugin{s: s}
	mount := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	_, err = p.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "too-big", VolumeCapabilities: mount, CapacityRange: &csi.CapacityRange{RequiredBytes: room + 1<<40}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume over the room: %v, want ResourceExhausted", err)
	}
	block := []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: mount[0].AccessMode}}
	if _, err := p.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "block", VolumeCapabilities: block}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateVolume of a block volume: %v, want InvalidArgument", err)
	}
	params := map[string]string{"numberOfReplicas": "3", "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "default"}
	vol, err := s.createVolume(ctx, "pvc-1", 16<<20, params)
	if err != nil {
		t.Fatal(err)
	}
	vol, _ = s.volumes().Get(ctx, vol.Name, metav1.GetOptions{})
	if vol.Status.State != lh.VolumeStateDetached || vol.Status.Robustness != lh.VolumeRobustnessUnknown || vol.Spec.NumberOfReplicas != 3 ||
		vol.Status.KubernetesStatus.PVCName != "data" {
		t.Errorf("new volume: %+v", vol.Status)
	}
	reps, _ := s.replicas(ctx, "pvc-1")
	scheduled, img := 0, ""
	for _, r := range reps {
		if r.Spec.NodeID == "lab9" {
			scheduled++
			img = s.imageOf(r.Spec.DataDirectoryName)
		}
	}
	if st, err := os.Stat(img); err != nil || st.Size() != 16<<20 {
		t.Errorf("image: %v", err)
	}
	if len(reps) != 3 || scheduled != 1 {
		t.Errorf("%d replicas, %d on lab9; want 3, 1", len(reps), scheduled)
	}
	disk, _ := s.disk(ctx)
	if disk.StorageScheduled != 16<<20 {
		t.Errorf("storageScheduled %d, want %d", disk.StorageScheduled, 16<<20)
	}

	if _, err := s.attach(ctx, "pvc-1", "lab12"); !errors.Is(err, errBusy) || !strings.Contains(err.Error(), "node lab12 runs no Longhorn") {
		t.Errorf("attach to a node without Longhorn: %v", err)
	}
	if primary, err := s.attach(ctx, "pvc-1", "lab9"); err != nil || primary.Spec.NodeID != "lab9" {
		t.Fatalf("attach: the copy served %+v, %v", primary, err)
	}
	worker := &lh.Node{ObjectMeta: metav1.ObjectMeta{Name: "lab12", Namespace: namespace}}
	if _, err := s.lh.LonghornV1beta2().Nodes(namespace).Create(ctx, worker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.attach(ctx, "pvc-1", "lab12"); !errors.Is(err, errBusy) || !strings.Contains(err.Error(), "volume pvc-1 is attached to node lab9") {
		t.Errorf("attach to another node while attached: %v", err)
	}
	vol, _ = s.volumes().Get(ctx, "pvc-1", metav1.GetOptions{})
	va, _ := s.lh.LonghornV1beta2().VolumeAttachments(namespace).Get(ctx, "pvc-1", metav1.GetOptions{})
	id := ticketID("pvc-1", "lab9")
	if vol.Status.State != lh.VolumeStateAttached || vol.Status.CurrentNodeID != "lab9" || vol.Status.Robustness != lh.VolumeRobustnessDegraded ||
		va.Spec.AttachmentTickets[id] == nil || !va.Status.AttachmentTicketStatuses[id].Satisfied {
		t.Errorf("attached: %+v, tickets %v", vol.Status, va.Spec.AttachmentTickets)
	}
	if err := s.deleteVolume(ctx, "pvc-1"); !errors.Is(err, errBusy) {
		t.Errorf("deleting an attached volume: %v", err)
	}
	reps, _ = s.replicas(ctx, "pvc-1")
	for _, r := range reps {
		if r.Spec.NodeID != "" && (r.Spec.HealthyAt == "" || r.Spec.LastHealthyAt == "") {
			t.Errorf("replica %s after attach: healthyAt %q, lastHealthyAt %q", r.Name, r.Spec.HealthyAt, r.Spec.LastHealthyAt)
		}
	}
	if err := s.detach(ctx, "pvc-1", "lab9"); err != nil {
		t.Fatal(err)
	}
	vol, _ = s.volumes().Get(ctx, "pvc-1", metav1.GetOptions{})
	va, _ = s.lh.LonghornV1beta2().VolumeAttachments(namespace).Get(ctx, "pvc-1", metav1.GetOptions{})
	if vol.Status.State != lh.VolumeStateDetached || vol.Status.Robustness != lh.VolumeRobustnessUnknown || vol.Status.CurrentNodeID != "" || len(va.Spec.AttachmentTickets) != 0 {
		t.Errorf("detached: %+v, tickets %v", vol.Status, va.Spec.AttachmentTickets)
	}

	if got, err := s.expand(ctx, "pvc-1", 32<<20); err != nil || got != 32<<20 {
		t.Fatalf("expand: %d, %v", got, err)
	}
	_, err = p.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 32<<20 + room + 1<<40}})
	if status.Code(err) != codes.OutOfRange {
		t.Errorf("ControllerExpandVolume over the room: %v, want OutOfRange", err)
	}
	if st, _ := os.Stat(img); st.Size() != 32<<20 {
		t.Errorf("image after expansion: %d bytes", st.Size())
	}

	settings := s.lh.LonghornV1beta2().Settings(namespace)
	st, _ := settings.Get(ctx, "fast-replica-rebuild-enabled", metav1.GetOptions{})
	st.Value = "false"
	if _, err := settings.Update(ctx, st, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ = settings.Get(ctx, "fast-replica-rebuild-enabled", metav1.GetOptions{}); st.Value != `{"v1":"false","v2":"false"}` || !st.Status.Applied {
		t.Errorf("fast-replica-rebuild-enabled after reconcile: %q, applied %v", st.Value, st.Status.Applied)
	}
	if st, _ = settings.Get(ctx, "upgrade-checker", metav1.GetOptions{}); st.Value != "true" {
		t.Errorf("upgrade-checker, not per engine, became %q", st.Value)
	}

	if err := s.deleteVolume(ctx, "pvc-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(img)); !os.IsNotExist(err) {
		t.Errorf("image after delete: %v", err)
	}
	if reps, _ := s.replicas(ctx, "pvc-1"); len(reps) != 0 {
		t.Errorf("%d replicas after delete", len(reps))
	}
}

// TestCopiesOnNodes runs the plugins of a server and a worker against one API: a volume with two
// copies has one on each, the worker's made by the worker's plugin; an engine on the worker
// serves the server's copy; a copy on a node gone NotReady is marked failed at the detach and
// left out at the next attach; with every copy failed, the one healthy last is salvaged.
func TestCopiesOnNodes(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		need.Missing(t, "mkfs.ext4 not found (make test-deps installs e2fsprogs)")
	}
	ctx := context.Background()
	lhc, kube := lhfake.NewSimpleClientset(), kubefake.NewClientset()
	srv := &store{lh: lhc, kube: kube, node: "lab9", root: t.TempDir()}
	w := &store{lh: lhc, kube: kube, node: "lab12", root: t.TempDir()}
	workerReady := func(ready corev1.ConditionStatus) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lab12"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
		if _, err := kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			if _, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	workerReady(corev1.ConditionTrue)
	for _, s := range []*store{srv, w} {
		if err := s.setUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	minimal, _ := lhc.LonghornV1beta2().Settings(namespace).Get(ctx, manager.SettingMinimalAvailable, metav1.GetOptions{})
	minimal.Value = "0"
	if _, err := lhc.LonghornV1beta2().Settings(namespace).Update(ctx, minimal, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The worker's plugin keeps its copies meanwhile, as it does in its reconcile pass.
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			w.keepCopies(wctx) //nolint:errcheck // the next pass tries again
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { stop(); <-done }()

	if _, err := srv.createVolume(ctx, "pvc-2", 16<<20, map[string]string{"numberOfReplicas": "2"}); err != nil {
		t.Fatal(err)
	}
	reps, _ := srv.replicas(ctx, "pvc-2")
	on := map[string]*lh.Replica{}
	for i := range reps {
		on[reps[i].Spec.NodeID] = &reps[i]
	}
	if len(reps) != 2 || on["lab9"] == nil || on["lab12"] == nil || on["lab9"].Spec.DataDirectoryName == on["lab12"].Spec.DataDirectoryName {
		t.Fatalf("copies of a volume with two: %+v", reps)
	}
	if _, err := os.Stat(w.imageOf(on["lab12"].Spec.DataDirectoryName)); err != nil {
		t.Errorf("the worker's copy has no data on the worker: %v", err)
	}
	if _, err := os.Stat(srv.imageOf(on["lab12"].Spec.DataDirectoryName)); !os.IsNotExist(err) {
		t.Errorf("the worker's copy has data on the server: %v", err)
	}
	primary, err := srv.attach(ctx, "pvc-2", "lab12")
	if err != nil || primary.Spec.NodeID != "lab9" {
		t.Fatalf("an engine on the worker serves %+v (%v), want the server's copy", primary, err)
	}

	workerReady(corev1.ConditionFalse)
	if err := srv.detach(ctx, "pvc-2", "lab12"); err != nil {
		t.Fatal(err)
	}
	r, _ := lhc.LonghornV1beta2().Replicas(namespace).Get(ctx, on["lab12"].Name, metav1.GetOptions{})
	if r.Spec.FailedAt == "" || r.Spec.LastFailedAt != r.Spec.FailedAt {
		t.Errorf("the copy on the NotReady worker after the detach: failedAt %q, lastFailedAt %q", r.Spec.FailedAt, r.Spec.LastFailedAt)
	}
	time.Sleep(time.Second) // the server's copy is healthy a second later than the worker's
	if primary, err = srv.attach(ctx, "pvc-2", "lab9"); err != nil || primary.Spec.NodeID != "lab9" {
		t.Fatalf("attach on the server: %+v, %v", primary, err)
	}
	if vol, _ := srv.volumes().Get(ctx, "pvc-2", metav1.GetOptions{}); vol.Status.Robustness != lh.VolumeRobustnessDegraded {
		t.Errorf("attached with one copy of two: %s", vol.Status.Robustness)
	}
	if err := srv.detach(ctx, "pvc-2", "lab9"); err != nil {
		t.Fatal(err)
	}

	// Both copies failed, the worker Ready again: the server's, healthy last, is salvaged. The
	// failure comes a second after the last healthy time, as timestamps have one-second precision.
	time.Sleep(time.Second)
	r, _ = lhc.LonghornV1beta2().Replicas(namespace).Get(ctx, on["lab9"].Name, metav1.GetOptions{})
	if err := srv.setFailed(ctx, r, manager.Now()); err != nil {
		t.Fatal(err)
	}
	workerReady(corev1.ConditionTrue)
	if primary, err = srv.attach(ctx, "pvc-2", "lab12"); err != nil || primary.Spec.NodeID != "lab9" || primary.Spec.FailedAt != "" {
		t.Fatalf("attach with every copy failed: %+v, %v; want the server's copy salvaged", primary, err)
	}
	if r, _ = lhc.LonghornV1beta2().Replicas(namespace).Get(ctx, on["lab12"].Name, metav1.GetOptions{}); r.Spec.FailedAt == "" {
		t.Errorf("the worker's copy, failed earlier, was salvaged too")
	}
}

// TestGrowFS grows an image's ext4 offline to the image's new size, as a stage after an
// expansion does.
func TestGrowFS(t *testing.T) {
	for _, c := range []string{"mkfs.ext4", "e2fsck", "resize2fs"} {
		if _, err := exec.LookPath(c); err != nil {
			need.Missing(t, "%s not found (make test-deps installs e2fsprogs)", c)
		}
	}
	ctx := context.Background()
	img := t.TempDir() + "/volume.img"
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if size, err := fsSize(img); err != nil || size != 16<<20 {
		t.Fatalf("fsSize of a new 16 MiB file system: %d, %v", size, err)
	}
	if err := os.Truncate(img, 48<<20); err != nil {
		t.Fatal(err)
	}
	if err := growFS(ctx, img); err != nil {
		t.Fatal(err)
	}
	if size, err := fsSize(img); err != nil || size != 48<<20 {
		t.Errorf("fsSize after growFS to 48 MiB: %d, %v", size, err)
	}
	if _, err := fsSize(os.Args[0]); err == nil {
		t.Error("fsSize of the test binary: no error")
	}
}
