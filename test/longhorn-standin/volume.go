package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/longhorn-standin/manager"
)

// errNoRoom is the scheduler's refusal: the node's disk lacks room for the size.
var errNoRoom = errors.New("no room")

// errBusy is a volume in a state the request cannot be served in.
var errBusy = errors.New("busy")

func engineName(vol string) string { return vol + "-e-0" }

func replicaName(vol string, i int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", vol, i))
	return vol + "-r-" + hex.EncodeToString(sum[:4])
}

// dataDirectory is the data directory of a volume's copy, as Longhorn names it: the volume's
// name and eight hex digits, different for each copy.
func dataDirectory(vol string, i int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d/data", vol, i))
	return vol + "-" + hex.EncodeToString(sum[:4])
}

// createVolume makes a volume as Longhorn's manager does for its CSI CreateVolume: the Volume
// (creating, then detached once the data of each copy exists), its Engine, one Replica per copy
// wanted, each on its own node with room for it (schedule), the copies Longhorn has no node for
// left unscheduled, and its VolumeAttachment without tickets. Each node's plugin makes the data
// of the copies on its node (keepCopies). params are the StorageClass's parameters with the
// provisioner's PVC metadata.
func (s *store) createVolume(ctx context.Context, name string, size int64, params map[string]string) (*lh.Volume, error) {
	if vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		if vol.Spec.Size != size {
			return nil, fmt.Errorf("%w: volume %s exists with size %d", errBusy, name, vol.Spec.Size)
		}
		if vol.Status.State == lh.VolumeStateCreating {
			return vol, s.makeData(ctx, vol)
		}
		return vol, nil
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	replicas := 3
	if v, ok := params["numberOfReplicas"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("numberOfReplicas %q: want a positive number", v)
		}
		replicas = n
	}
	locality := lh.DataLocality(params["dataLocality"])
	if locality == "" {
		locality = lh.DataLocalityDisabled
	}
	// The class's tags, comma-separated, as Longhorn's CSI driver reads them (csi/util.go
	// getVolumeOptions).
	tags := func(param string) []string {
		var out []string
		for _, t := range strings.Split(params[param], ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
		return out
	}
	nodeSelector, diskSelector := tags("nodeSelector"), tags("diskSelector")
	nodes, err := s.schedule(ctx, size, replicas, nodeSelector, diskSelector, nil)
	if err != nil {
		return nil, err
	}
	image, err := s.defaultEngineImage(ctx)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{"longhornvolume": name}
	// The per-volume overrides Longhorn's volume mutator fills in ("ignored": the global setting
	// applies), and its backup defaults (the settings' lz4 and 2 MiB).
	vol := &lh.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}, Spec: lh.VolumeSpec{
		Size: size, NumberOfReplicas: replicas, DataLocality: locality, Frontend: lh.VolumeFrontendBlockDev, NodeSelector: nodeSelector, DiskSelector: diskSelector,
		Image: image, DataEngine: lh.DataEngineTypeV1, AccessMode: lh.AccessModeReadWriteOnce, StaleReplicaTimeout: 30,
		ReplicaAutoBalance: lh.ReplicaAutoBalanceIgnored, SnapshotDataIntegrity: lh.SnapshotDataIntegrityIgnored,
		UnmapMarkSnapChainRemoved: lh.UnmapMarkSnapChainRemovedIgnored, RestoreVolumeRecurringJob: lh.RestoreVolumeRecurringJobDefault,
		ReplicaSoftAntiAffinity: lh.ReplicaSoftAntiAffinityDefault, ReplicaZoneSoftAntiAffinity: lh.ReplicaZoneSoftAntiAffinityDefault,
		ReplicaDiskSoftAntiAffinity: lh.ReplicaDiskSoftAntiAffinityDefault, FreezeFilesystemForSnapshot: lh.FreezeFilesystemForSnapshotDefault,
		OfflineRebuilding: lh.VolumeOfflineRebuildingIgnored, BackupCompressionMethod: lh.BackupCompressionMethodLz4, BackupBlockSize: 2 << 20,
	}}
	if vol, err = s.volumes().Create(ctx, vol, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	vol.Status = lh.VolumeStatus{OwnerID: s.node, State: lh.VolumeStateCreating, Robustness: lh.VolumeRobustnessUnknown,
		CurrentImage: image, KubernetesStatus: lh.KubernetesStatus{PVName: name,
			Namespace: params["csi.storage.k8s.io/pvc/namespace"], PVCName: params["csi.storage.k8s.io/pvc/name"]}}
	if vol, err = s.volumes().UpdateStatus(ctx, vol, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	api := s.lh.LonghornV1beta2()
	engine := &lh.Engine{ObjectMeta: metav1.ObjectMeta{Name: engineName(name), Namespace: namespace, Labels: labels, OwnerReferences: ownedBy(vol)},
		Spec: lh.EngineSpec{InstanceSpec: instanceOf(vol), Frontend: lh.VolumeFrontendBlockDev, Active: true, ReplicaAddressMap: map[string]string{}}}
	if _, err := api.Engines(namespace).Create(ctx, engine, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	for i := range replicas {
		node := ""
		if i < len(nodes) {
			node = nodes[i]
		}
		if _, err := api.Replicas(namespace).Create(ctx, s.newReplica(vol, i, node), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	va := &lh.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels, OwnerReferences: ownedBy(vol)},
		Spec: lh.VolumeAttachmentSpec{Volume: name, AttachmentTickets: map[string]*lh.AttachmentTicket{}}}
	if _, err := api.VolumeAttachments(namespace).Create(ctx, va, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return vol, s.makeData(ctx, vol)
}

// ownedBy makes an object vol's, as Longhorn's engines and replicas are their volume's.
func ownedBy(vol *lh.Volume) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "longhorn.io/v1beta2", Kind: "Volume", Name: vol.Name, UID: vol.UID}}
}

// instanceOf is the instance spec of vol's engine and copies, stopped.
func instanceOf(vol *lh.Volume) lh.InstanceSpec {
	return lh.InstanceSpec{VolumeName: vol.Name, VolumeSize: vol.Spec.Size, Image: vol.Spec.Image, DesireState: lh.InstanceStateStopped, DataEngine: lh.DataEngineTypeV1}
}

// newReplica is copy i of vol, scheduled on node ("": unscheduled).
func (s *store) newReplica(vol *lh.Volume, i int, node string) *lh.Replica {
	r := &lh.Replica{ObjectMeta: metav1.ObjectMeta{Name: replicaName(vol.Name, i), Namespace: namespace, Labels: map[string]string{"longhornvolume": vol.Name}, OwnerReferences: ownedBy(vol)},
		Spec: lh.ReplicaSpec{InstanceSpec: instanceOf(vol), EngineName: engineName(vol.Name), Active: true}}
	if node != "" {
		r.Spec.NodeID, r.Spec.DiskID, r.Spec.DiskPath, r.Spec.DataDirectoryName = node, "standin-"+node, s.root+"/", dataDirectory(vol.Name, i)
		r.Labels["longhornnode"], r.Labels["longhorndiskuuid"] = node, "standin-"+node
	}
	return r
}

// makeData has each copy's node make its data (waitData), then marks the volume detached.
func (s *store) makeData(ctx context.Context, vol *lh.Volume) error {
	if err := s.waitData(ctx, vol.Name); err != nil {
		return err
	}
	return s.setState(ctx, vol.Name, func(v *lh.Volume) {
		v.Status.State = lh.VolumeStateDetached
		v.Status.Conditions = []lh.Condition{s.scheduled(ctx, v)}
	})
}

// waitData has the node of each of the volume's copies make its data (keepCopies: this node's at
// once, another's within a pass of its plugin), and waits until they have.
func (s *store) waitData(ctx context.Context, vol string) error {
	if err := s.keepCopies(ctx); err != nil {
		return err
	}
	var waiting string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		reps, err := s.replicas(ctx, vol)
		if err != nil {
			return false, err
		}
		waiting = ""
		for _, r := range reps {
			if r.Spec.NodeID != "" && r.Status.OwnerID != r.Spec.NodeID {
				waiting = r.Spec.NodeID
			}
		}
		return waiting == "", nil
	})
	if err != nil {
		return fmt.Errorf("%w: node %s has not made the data of its copy of volume %s: %v", errBusy, waiting, vol, err)
	}
	return nil
}

// makeImage makes a copy's data at img: a sparse image of size holding an ext4 file system.
func makeImage(ctx context.Context, img string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return err
	}
	tmp := img + ".new"
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(tmp, size); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", tmp, err, out)
	}
	return os.Rename(tmp, img)
}

// scheduled is the volume's Scheduled condition: false while some copies have no node.
func (s *store) scheduled(ctx context.Context, vol *lh.Volume) lh.Condition {
	c := lh.Condition{Type: lh.VolumeConditionTypeScheduled, Status: lh.ConditionStatusTrue, LastTransitionTime: manager.Now()}
	if reps, err := s.replicas(ctx, vol.Name); err == nil {
		for _, r := range reps {
			if r.Spec.NodeID == "" {
				c.Status, c.Reason = lh.ConditionStatusFalse, lh.VolumeConditionReasonReplicaSchedulingFailure
				c.Message = "replica scheduling failed: no other node with room for a copy"
			}
		}
	}
	return c
}

func (s *store) replicas(ctx context.Context, vol string) ([]lh.Replica, error) {
	list, err := s.lh.LonghornV1beta2().Replicas(namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + vol})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// setState changes a volume's status with change, retrying on conflicts.
func (s *store) setState(ctx context.Context, name string, change func(*lh.Volume)) error {
	for {
		vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(vol)
		_, err = s.volumes().UpdateStatus(ctx, vol, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// deleteVolume removes a detached volume's objects and the data of its copies on this node;
// each other node's plugin removes the data of its copies once their Replicas are gone
// (keepCopies).
func (s *store) deleteVolume(ctx context.Context, name string) error {
	vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return s.keepCopies(ctx)
	}
	if err != nil {
		return err
	}
	if vol.Status.State != lh.VolumeStateDetached && vol.Status.State != lh.VolumeStateCreating && vol.Status.State != lh.VolumeStateDeleting {
		return fmt.Errorf("%w: volume %s is %s", errBusy, name, vol.Status.State)
	}
	if err := s.setState(ctx, name, func(v *lh.Volume) { v.Status.State = lh.VolumeStateDeleting }); err != nil {
		return err
	}
	api := s.lh.LonghornV1beta2()
	reps, err := s.replicas(ctx, name)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range reps {
		errs = append(errs, ignoreNotFound(api.Replicas(namespace).Delete(ctx, r.Name, metav1.DeleteOptions{})))
	}
	errs = append(errs,
		ignoreNotFound(api.Engines(namespace).Delete(ctx, engineName(name), metav1.DeleteOptions{})),
		ignoreNotFound(api.VolumeAttachments(namespace).Delete(ctx, name, metav1.DeleteOptions{})),
		s.keepCopies(ctx))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ignoreNotFound(s.volumes().Delete(ctx, name, metav1.DeleteOptions{}))
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// attach adds the csi-attacher ticket for node to the volume's VolumeAttachment and attaches the
// volume there, as Longhorn's attachment and volume controllers do: attaching, its engine on node
// and its reachable copies running RW (healthyAt set the first time, lastHealthyAt every time),
// then attached, healthy when every copy wanted is RW, degraded otherwise; the ticket then
// satisfied. A copy on a node that is not Ready is marked failed, as the engine marks a replica
// it cannot reach; with no copy left that has not failed, the one healthy last is salvaged. It
// returns the copy whose data the engine serves (primary), the same while the volume stays
// attached.
func (s *store) attach(ctx context.Context, name, node string) (*lh.Replica, error) {
	vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if node != s.node {
		// Longhorn's engine runs on any node its manager runs on: there, the stand-in's node
		// plugin, which made the node's Longhorn Node.
		if _, err := s.lh.LonghornV1beta2().Nodes(namespace).Get(ctx, node, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("%w: node %s runs no Longhorn: %v", errBusy, node, err)
		}
	}
	if vol.Status.State == lh.VolumeStateAttached && vol.Status.CurrentNodeID != node {
		// One node at a time: Longhorn attaches a ReadWriteOnce volume elsewhere only once its
		// ticket there is gone.
		return nil, fmt.Errorf("%w: volume %s is attached to node %s", errBusy, name, vol.Status.CurrentNodeID)
	}
	switch vol.Status.State {
	case lh.VolumeStateAttached, lh.VolumeStateDetached, lh.VolumeStateAttaching:
	default:
		return nil, fmt.Errorf("%w: volume %s is %s", errBusy, name, vol.Status.State)
	}
	id := ticketID(name, node)
	if err := s.updateTickets(ctx, name, func(va *lh.VolumeAttachment) {
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*lh.AttachmentTicket{}
		}
		if _, ok := va.Spec.AttachmentTickets[id]; !ok {
			va.Spec.AttachmentTickets[id] = &lh.AttachmentTicket{ID: id, Type: lh.AttacherTypeCSIAttacher, NodeID: node,
				Parameters: map[string]string{"disableFrontend": "false", "lastAttachedBy": ""}}
		}
	}); err != nil {
		return nil, err
	}
	var primary *lh.Replica
	if vol.Status.State == lh.VolumeStateAttached {
		if primary, err = s.lh.LonghornV1beta2().Replicas(namespace).Get(ctx, vol.Annotations[annotationPrimary], metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("the copy volume %s's engine serves: %w", name, err)
		}
	} else {
		if err := s.setState(ctx, name, func(v *lh.Volume) { v.Status.State = lh.VolumeStateAttaching }); err != nil {
			return nil, err
		}
		usable, err := s.usableCopies(ctx, name)
		if err != nil {
			return nil, err
		}
		primary = choosePrimary(usable, node, s.node)
		if err := s.instances(ctx, vol, node, usable); err != nil {
			return nil, err
		}
		vol, err = s.volumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if vol.Annotations == nil {
			vol.Annotations = map[string]string{}
		}
		vol.Annotations[annotationPrimary] = primary.Name
		vol.Spec.NodeID = node
		if _, err := s.volumes().Update(ctx, vol, metav1.UpdateOptions{}); err != nil {
			return nil, err
		}
		if err := s.setState(ctx, name, func(v *lh.Volume) {
			v.Status.State, v.Status.CurrentNodeID = lh.VolumeStateAttached, node
			v.Status.Robustness = lh.VolumeRobustnessHealthy
			if len(usable) < v.Spec.NumberOfReplicas {
				v.Status.Robustness = lh.VolumeRobustnessDegraded
				v.Status.LastDegradedAt = manager.Now()
			}
		}); err != nil {
			return nil, err
		}
	}
	return primary, s.updateTicketStatus(ctx, name, func(va *lh.VolumeAttachment) {
		if va.Status.AttachmentTicketStatuses == nil {
			va.Status.AttachmentTicketStatuses = map[string]*lh.AttachmentTicketStatus{}
		}
		gen := va.Spec.AttachmentTickets[id].Generation
		va.Status.AttachmentTicketStatuses[id] = &lh.AttachmentTicketStatus{ID: id, Satisfied: true, Generation: gen,
			Conditions: []lh.Condition{{Type: lh.AttachmentStatusConditionTypeSatisfied, Status: lh.ConditionStatusTrue, LastTransitionTime: manager.Now()}}}
	})
}

// detach removes node's csi-attacher ticket; once no ticket is left, the other copies the engine
// ran take the data of the copy it served (syncCopies), the volume's file system is unmounted
// wherever it still is and the devices serving its copies detached, and the volume goes
// detaching, then detached (robustness unknown, its engine and copies stopped).
func (s *store) detach(ctx context.Context, name, node string) error {
	id := ticketID(name, node)
	left := 0
	err := s.updateTickets(ctx, name, func(va *lh.VolumeAttachment) {
		delete(va.Spec.AttachmentTickets, id)
		left = len(va.Spec.AttachmentTickets)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.updateTicketStatus(ctx, name, func(va *lh.VolumeAttachment) { delete(va.Status.AttachmentTicketStatuses, id) }); err != nil {
		return err
	}
	if left > 0 {
		return nil
	}
	vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ignoreNotFound(err)
	}
	if vol.Status.State == lh.VolumeStateDetached {
		return nil
	}
	if err := s.setState(ctx, name, func(v *lh.Volume) { v.Status.State = lh.VolumeStateDetaching }); err != nil {
		return err
	}
	if err := s.syncCopies(ctx, vol); err != nil {
		return err
	}
	if err := s.dropEvicted(ctx, name); err != nil {
		return err
	}
	if err := s.instances(ctx, vol, "", nil); err != nil {
		return err
	}
	if vol, err = s.volumes().Get(ctx, name, metav1.GetOptions{}); err != nil {
		return err
	}
	delete(vol.Annotations, annotationPrimary)
	vol.Spec.NodeID = ""
	if _, err := s.volumes().Update(ctx, vol, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return s.setState(ctx, name, func(v *lh.Volume) {
		v.Status.State, v.Status.CurrentNodeID, v.Status.Robustness = lh.VolumeStateDetached, "", lh.VolumeRobustnessUnknown
	})
}

// instances starts (on node, the copies in running RW) or stops (running nil) the volume's
// engine and its copies, as the instance manager reports them. Where a stand-in manager runs, an
// engine starts only in the node's instance manager of the default image, once it runs, and
// stays in it until it stops (status.instanceManagerName).
func (s *store) instances(ctx context.Context, vol *lh.Volume, node string, running []*lh.Replica) error {
	api := s.lh.LonghornV1beta2()
	im := ""
	if running != nil {
		var err error
		if im, err = s.instanceManager(ctx, node); err != nil {
			return err
		}
	}
	reps, err := s.replicas(ctx, vol.Name)
	if err != nil {
		return err
	}
	run := running != nil
	state, desire := lh.InstanceStateStopped, lh.InstanceStateStopped
	if run {
		state, desire = lh.InstanceStateRunning, lh.InstanceStateRunning
	}
	modes, times := map[string]lh.ReplicaMode{}, map[string]string{}
	for i := range reps {
		if reps[i].Spec.NodeID == "" {
			continue
		}
		name := reps[i].Name
		rw := slices.ContainsFunc(running, func(u *lh.Replica) bool { return u.Name == name })
		t := manager.Now()
		if rw {
			modes[name], times[name] = lh.ReplicaModeRW, t
		}
		_, err := s.updateReplica(ctx, name, func(r *lh.Replica) {
			r.Spec.DesireState, r.Spec.VolumeSize = lh.InstanceStateStopped, vol.Spec.Size
			if rw {
				if r.Spec.HealthyAt == "" {
					r.Spec.HealthyAt = t
				}
				r.Spec.DesireState, r.Spec.LastHealthyAt = desire, t
			}
		}, func(r *lh.Replica) {
			r.Status.OwnerID, r.Status.CurrentState, r.Status.Started = r.Spec.NodeID, lh.InstanceStateStopped, false
			if rw {
				r.Status.CurrentState, r.Status.Started = state, true
			}
			r.Status.CurrentImage = r.Spec.Image
		})
		if err != nil {
			return err
		}
	}
	e, err := api.Engines(namespace).Get(ctx, engineName(vol.Name), metav1.GetOptions{})
	if err != nil {
		return err
	}
	e.Spec.NodeID, e.Spec.DesireState, e.Spec.VolumeSize = node, desire, vol.Spec.Size
	if e, err = api.Engines(namespace).Update(ctx, e, metav1.UpdateOptions{}); err != nil {
		return err
	}
	e.Status.OwnerID, e.Status.CurrentState, e.Status.Started, e.Status.CurrentImage = s.node, state, run, e.Spec.Image
	switch {
	case !run:
		e.Status.InstanceManagerName = ""
	case e.Status.InstanceManagerName == "":
		e.Status.InstanceManagerName = im
	}
	e.Status.ReplicaModeMap, e.Status.ReplicaTransitionTimeMap = nil, nil
	if run {
		e.Status.ReplicaModeMap, e.Status.ReplicaTransitionTimeMap, e.Status.CurrentSize = modes, times, vol.Spec.Size
	}
	_, err = api.Engines(namespace).UpdateStatus(ctx, e, metav1.UpdateOptions{})
	return err
}

// updateTickets changes a Longhorn VolumeAttachment's spec with change, again on a conflict.
func (s *store) updateTickets(ctx context.Context, name string, change func(*lh.VolumeAttachment)) error {
	return s.updateAttachment(ctx, name, change, false)
}

// updateTicketStatus changes its status.
func (s *store) updateTicketStatus(ctx context.Context, name string, change func(*lh.VolumeAttachment)) error {
	return s.updateAttachment(ctx, name, change, true)
}

func (s *store) updateAttachment(ctx context.Context, name string, change func(*lh.VolumeAttachment), status bool) error {
	api := s.lh.LonghornV1beta2().VolumeAttachments(namespace)
	for {
		va, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(va)
		if status {
			_, err = api.UpdateStatus(ctx, va, metav1.UpdateOptions{})
		} else {
			_, err = api.Update(ctx, va, metav1.UpdateOptions{})
		}
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// expand grows a volume to size: its Volume, Engine and Replicas, and the image of each copy,
// this node's at once, another's by its plugin's next pass (keepCopies), before the copy next
// serves. Each copy's node needs room for the growth. A file system grows when it is next
// staged.
func (s *store) expand(ctx context.Context, name string, size int64) (int64, error) {
	vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if vol.Status.State != lh.VolumeStateDetached && vol.Status.State != lh.VolumeStateAttached {
		return 0, fmt.Errorf("%w: volume %s invalid state %s for controller volume expansion", errBusy, name, vol.Status.State)
	}
	if size <= vol.Spec.Size {
		return vol.Spec.Size, nil
	}
	api := s.lh.LonghornV1beta2()
	reps, err := s.replicas(ctx, name)
	if err != nil {
		return 0, err
	}
	more := size - vol.Spec.Size
	for _, r := range reps {
		if r.Spec.NodeID == "" {
			continue
		}
		n, err := api.Nodes(namespace).Get(ctx, r.Spec.NodeID, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		room, err := s.room(ctx, n)
		if err != nil {
			return 0, err
		}
		if more > room {
			return 0, fmt.Errorf("%w: failed to schedule %d more bytes to disk %s of node %s: %d bytes schedulable", errNoRoom, more, defaultDisk, n.Name, room)
		}
	}
	vol.Spec.Size = size
	if _, err := s.volumes().Update(ctx, vol, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	for i := range reps {
		if _, err := s.updateReplica(ctx, reps[i].Name, func(r *lh.Replica) { r.Spec.VolumeSize = size }, nil); err != nil {
			return 0, err
		}
	}
	e, err := api.Engines(namespace).Get(ctx, engineName(name), metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	e.Spec.VolumeSize = size
	if _, err := api.Engines(namespace).Update(ctx, e, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	return size, s.keepCopies(ctx)
}

// mount is one line of /proc/self/mountinfo.
type mount struct{ point, source string }

func mounts() []mount {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []mount
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if i := slices.Index(f, "-"); i > 4 && i+2 < len(f) {
			out = append(out, mount{point: unescape(f[4]), source: f[i+2]})
		}
	}
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mounted(path string) bool {
	return sourceOf(path) != ""
}

// sourceOf is the source of what is mounted at path (the latest mount), "" when nothing is.
func sourceOf(path string) string {
	ms := mounts()
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].point == path {
			return ms[i].source
		}
	}
	return ""
}

// unmountSource unmounts what is mounted at path and every other mount of its source (bind
// mounts first, the file system last), and removes the node of a loop device it was, which this
// host made to mount another host's device (stageRemote) and which that host detaches.
func unmountSource(path string) error {
	ms := mounts()
	i := slices.IndexFunc(ms, func(m mount) bool { return m.point == path })
	if i < 0 {
		return nil
	}
	source := ms[i].source
	if err := unmountAll(ms, source); err != nil {
		return err
	}
	return loop.DropNode(source)
}

// unmountAll unmounts every mount in ms (mountinfo's lines) of source, the latest first.
func unmountAll(ms []mount, source string) error {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].source == source {
			if err := unix.Unmount(ms[i].point, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", ms[i].point, err)
			}
		}
	}
	return nil
}

// release unmounts every mount of the loop device bound to img (bind mounts first, the file
// system last) and detaches it. The device is held open from before the first unmount, so that
// the kernel's autoclear cannot hand its number to anyone else before it is detached here.
func release(img string) error {
	n := loop.Find(img)
	if n < 0 {
		return nil
	}
	d, err := loop.Open(n)
	if err != nil {
		return err
	}
	if !d.BoundTo(img) { // detached before it was opened, or another host's file of that path
		return d.Close()
	}
	if err := unmountAll(mounts(), d.Path); err != nil {
		d.Close()
		return err
	}
	return d.Detach()
}
