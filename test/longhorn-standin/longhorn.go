package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	lhclient "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned"
	lhtyped "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned/typed/longhorn/v1beta2"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/longhorn-standin/manager"
)

const (
	driverName = "driver.longhorn.io"
	namespace  = "longhorn-system"
	// defaultDisk names the node's one disk, Longhorn's data path.
	defaultDisk = "default-disk-standin"
	// reservedPercent is storage-reserved-percentage-for-default-disk's default: the share of the
	// default disk Longhorn keeps from scheduling.
	reservedPercent = 30
	// sizeAlignment is Longhorn's volume size alignment (util.SizeAlignment): sizes round up to it.
	sizeAlignment = 2 << 20
)

// crdNames are the Longhorn CRDs the stand-in keeps objects of.
var crdNames = []string{
	"volumes.longhorn.io", "replicas.longhorn.io", "engines.longhorn.io", "volumeattachments.longhorn.io",
	"nodes.longhorn.io", "settings.longhorn.io", "engineimages.longhorn.io",
}

// ticketID is the ID of the csi-attacher ticket Longhorn's ControllerPublishVolume makes, which is
// also the name of Kubernetes' VolumeAttachment for the volume and node.
func ticketID(vol, node string) string {
	sum := sha256.Sum256([]byte(vol + driverName + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// roundUp rounds a size up to Longhorn's alignment, as its CSI CreateVolume does.
func roundUp(size int64) int64 {
	if size <= 0 {
		return sizeAlignment
	}
	return (size + sizeAlignment - 1) / sizeAlignment * sizeAlignment
}

// store keeps the stand-in's Longhorn objects for one node.
type store struct {
	lh   lhclient.Interface
	kube kubernetes.Interface
	node string
	// controller marks the plugin on the node the CSI sidecars serve, which also evicts copies
	// from cordoned nodes (evict).
	controller bool
	root       string // Longhorn's data path, /var/lib/longhorn
	// exported holds the loop devices of volumes attached to other nodes (see export), by name.
	exported map[string]*loop.Device
}

func (s *store) volumes() lhtyped.VolumeInterface { return s.lh.LonghornV1beta2().Volumes(namespace) }

// imageOf is where a copy's data is on its node: an ext4 file system in a sparse image file in
// the copy's data directory (the replica's spec.dataDirectoryName).
func (s *store) imageOf(dataDir string) string {
	return filepath.Join(s.root, "replicas", dataDir, "volume.img")
}

// installCRDs creates or updates the CRDs the stand-in needs, from crds (Longhorn's crds.yaml),
// and waits until they are Established.
func installCRDs(ctx context.Context, client apiextensionsclientset.Interface, crds []byte) error {
	want := map[string]bool{}
	for _, n := range crdNames {
		want[n] = true
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(crds), 4096)
	found := 0
	for {
		var crd apiextensionsv1.CustomResourceDefinition
		err := dec.Decode(&crd)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read Longhorn's CRDs: %w", err)
		}
		if !want[crd.Name] {
			continue
		}
		found++
		api := client.ApiextensionsV1().CustomResourceDefinitions()
		old, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, &crd, metav1.CreateOptions{})
		case err == nil:
			crd.ResourceVersion = old.ResourceVersion
			_, err = api.Update(ctx, &crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("CRD %s: %w", crd.Name, err)
		}
	}
	if found != len(crdNames) {
		return fmt.Errorf("Longhorn's CRDs: %d of the %d needed found", found, len(crdNames))
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range crdNames {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			established := false
			for _, c := range crd.Status.Conditions {
				established = established || c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			}
			if !established {
				return false, nil
			}
		}
		return true, nil
	})
}

// setUp makes what Longhorn's manager makes when it starts: its namespace, its settings with
// their defaults, the engine image (deployed on this node) and this node's Node with its disk.
func (s *store) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := s.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// The manager's part, where no stand-in manager runs (the lab's clusters whose chart has no
	// longhorn-manager DaemonSet): the release it recorded, else the newest.
	rel, err := manager.Running(ctx, s.lh)
	if err != nil {
		return err
	}
	if err := manager.EnsureSettings(ctx, s.lh, rel); err != nil {
		return err
	}
	if err := manager.EnsureEngineImage(ctx, s.lh, rel, s.node); err != nil {
		return err
	}
	api := s.lh.LonghornV1beta2()
	if err := os.MkdirAll(filepath.Join(s.root, "replicas"), 0o700); err != nil {
		return err
	}
	disk, err := s.disk(ctx)
	if err != nil {
		return err
	}
	node := &lh.Node{ObjectMeta: metav1.ObjectMeta{Name: s.node, Namespace: namespace}, Spec: lh.NodeSpec{
		Name: s.node, AllowScheduling: true,
		Disks: map[string]lh.DiskSpec{defaultDisk: {Type: lh.DiskTypeFilesystem, Path: s.root + "/", AllowScheduling: true,
			StorageReserved: disk.StorageMaximum * reservedPercent / 100}},
	}}
	_, err = api.Nodes(namespace).Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Made before the plugin ran (a chart fixture stands in for the manager that makes it):
		// Longhorn's manager gives a node without disks its default disk.
		err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			n, err := api.Nodes(namespace).Get(ctx, s.node, metav1.GetOptions{})
			if err != nil || len(n.Spec.Disks) > 0 {
				return err
			}
			n.Spec.Name, n.Spec.Disks = s.node, node.Spec.Disks
			_, err = api.Nodes(namespace).Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", s.node, err)
	}
	return s.updateNode(ctx)
}

// disk is the node's disk as Longhorn's node controller reports it: statfs of the data path,
// and the sizes of the replicas scheduled on it.
func (s *store) disk(ctx context.Context) (*lh.DiskStatus, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(s.root, &fs); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", s.root, err)
	}
	st := &lh.DiskStatus{
		StorageMaximum: int64(fs.Blocks) * fs.Bsize, StorageAvailable: int64(fs.Bavail) * fs.Bsize,
		ScheduledReplica: map[string]int64{}, DiskUUID: "standin-" + s.node, DiskName: defaultDisk, DiskPath: s.root + "/",
		Type: lh.DiskTypeFilesystem, FSType: "ext4",
		Conditions: []lh.Condition{
			{Type: lh.DiskConditionTypeReady, Status: lh.ConditionStatusTrue},
			{Type: lh.DiskConditionTypeSchedulable, Status: lh.ConditionStatusTrue},
		},
	}
	reps, err := s.lh.LonghornV1beta2().Replicas(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, r := range reps.Items {
		if r.Spec.NodeID == s.node {
			st.ScheduledReplica[r.Name] = r.Spec.VolumeSize
			st.StorageScheduled += r.Spec.VolumeSize
		}
	}
	return st, nil
}

// updateNode writes the node's conditions and its disk's status.
func (s *store) updateNode(ctx context.Context) error {
	api := s.lh.LonghornV1beta2().Nodes(namespace)
	node, err := api.Get(ctx, s.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	disk, err := s.disk(ctx)
	if err != nil {
		return err
	}
	keep := func(old []lh.Condition, c lh.Condition) lh.Condition {
		for _, o := range old {
			if o.Type == c.Type && o.Status == c.Status {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		if c.LastTransitionTime == "" {
			c.LastTransitionTime = manager.Now()
		}
		return c
	}
	var oldDisk []lh.Condition
	if d := node.Status.DiskStatus[defaultDisk]; d != nil {
		oldDisk = d.Conditions
	}
	for i, c := range disk.Conditions {
		disk.Conditions[i] = keep(oldDisk, c)
	}
	node.Status.DiskStatus = map[string]*lh.DiskStatus{defaultDisk: disk}
	node.Status.Conditions = []lh.Condition{
		keep(node.Status.Conditions, lh.Condition{Type: lh.NodeConditionTypeReady, Status: lh.ConditionStatusTrue}),
		keep(node.Status.Conditions, lh.Condition{Type: lh.NodeConditionTypeSchedulable, Status: lh.ConditionStatusTrue}),
	}
	_, err = api.UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// room is what Longhorn's replica scheduler can still place on node's disk: the replicas
// scheduled there stay within (maximum − reserved) × over-provisioning%, and what is available
// stays above minimal-available% of the maximum. This node's disk is measured now; another's is
// what its plugin last reported.
func (s *store) room(ctx context.Context, node *lh.Node) (int64, error) {
	disk := node.Status.DiskStatus[defaultDisk]
	if node.Name == s.node {
		var err error
		if disk, err = s.disk(ctx); err != nil {
			return 0, err
		}
	}
	if disk == nil {
		return 0, nil
	}
	reps, err := s.lh.LonghornV1beta2().Replicas(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	var scheduled int64
	for _, r := range reps.Items {
		if r.Spec.NodeID == node.Name {
			scheduled += r.Spec.VolumeSize
		}
	}
	minimal, over := s.settingInt(ctx, manager.SettingMinimalAvailable, 25), s.settingInt(ctx, manager.SettingOverProvisioning, 100)
	reserved := node.Spec.Disks[defaultDisk].StorageReserved
	byScheduling := (disk.StorageMaximum-reserved)*over/100 - scheduled
	byAvailable := disk.StorageAvailable - disk.StorageMaximum*minimal/100
	return max(0, min(byScheduling, byAvailable)), nil
}

func (s *store) settingInt(ctx context.Context, name string, def int64) int64 {
	st, err := s.lh.LonghornV1beta2().Settings(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return def
	}
	n, err := strconv.ParseInt(strings.TrimSpace(st.Value), 10, 64)
	if err != nil {
		return def
	}
	return n
}

// reconcile does what Longhorn's controllers and webhooks would have done since the last pass:
// a plain value written to a data-engine-specific setting becomes its per-engine JSON (the
// setting mutator's rewrite, here after the write rather than during it), every setting is
// applied, the node's disk is measured, the copies on it kept (keepCopies), copies evicted from
// cordoned nodes (the controller's, evict), and each volume's Kubernetes status and actual size
// follow its PV and image.
func (s *store) reconcile(ctx context.Context) error {
	api := s.lh.LonghornV1beta2()
	list, err := api.Settings(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	rel, err := manager.Running(ctx, s.lh)
	if err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		st := &list.Items[i]
		if def, ok := manager.FindSetting(st.Name); ok {
			if v := rel.Value(def, st.Value); v != st.Value {
				st.Value = v
				if st, err = api.Settings(namespace).Update(ctx, st, metav1.UpdateOptions{}); err != nil {
					errs = append(errs, ignoreConflict(err))
					continue
				}
			}
		}
		if !st.Status.Applied {
			st.Status.Applied = true
			if _, err := api.Settings(namespace).UpdateStatus(ctx, st, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, ignoreConflict(err))
			}
		}
	}
	errs = append(errs, s.updateNode(ctx), s.keepCopies(ctx))
	if s.controller {
		errs = append(errs, s.evict(ctx))
	}
	vols, err := api.Volumes(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	reps, err := api.Replicas(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for i := range vols.Items {
		errs = append(errs, s.reconcileVolume(ctx, &vols.Items[i], reps.Items))
	}
	if s.controller {
		errs = append(errs, s.upgradeEngines(ctx, vols.Items))
	}
	return errors.Join(errs...)
}

// reconcileVolume updates a volume's kubernetesStatus from its PV (named as the volume) and its
// claim, and its actualSize from the blocks its image takes on the node of its first copy (by
// name), which that node's plugin measures.
func (s *store) reconcileVolume(ctx context.Context, vol *lh.Volume, reps []lh.Replica) error {
	ks := vol.Status.KubernetesStatus
	pv, err := s.kube.CoreV1().PersistentVolumes().Get(ctx, vol.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		ks.PVName, ks.PVStatus = pv.Name, string(pv.Status.Phase)
		if ref := pv.Spec.ClaimRef; ref != nil {
			ks.Namespace, ks.PVCName = ref.Namespace, ref.Name
		}
	case apierrors.IsNotFound(err):
		ks.PVStatus = ""
	default:
		return err
	}
	actual := vol.Status.ActualSize
	if first := firstCopy(reps, vol.Name); first != nil && first.Spec.NodeID == s.node {
		var st unix.Stat_t
		if unix.Stat(s.imageOf(first.Spec.DataDirectoryName), &st) == nil {
			actual = st.Blocks * 512
		}
	}
	if equalKS(ks, vol.Status.KubernetesStatus) && actual == vol.Status.ActualSize {
		return nil
	}
	vol.Status.KubernetesStatus, vol.Status.ActualSize = ks, actual
	_, err = s.volumes().UpdateStatus(ctx, vol, metav1.UpdateOptions{})
	return ignoreConflict(ignoreNotFound(err))
}

// firstCopy is the volume's scheduled copy first by name, nil when none is.
func firstCopy(reps []lh.Replica, vol string) *lh.Replica {
	var first *lh.Replica
	for i := range reps {
		r := &reps[i]
		if r.Spec.VolumeName == vol && r.Spec.NodeID != "" && (first == nil || r.Name < first.Name) {
			first = r
		}
	}
	return first
}

// ignoreConflict drops a conflict: the object changed meanwhile, and the next pass sees it.
func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func equalKS(a, b lh.KubernetesStatus) bool {
	return a.PVName == b.PVName && a.PVStatus == b.PVStatus && a.Namespace == b.Namespace && a.PVCName == b.PVCName
}
