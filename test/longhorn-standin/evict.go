package main

import (
	"context"
	"errors"
	"slices"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/test/longhorn-standin/manager"
)

// evictPolicy is the value of node-drain-policy under which Longhorn evicts, from a cordoned
// node, each copy that is its volume's last healthy one (kip pins it).
const evictPolicy = "block-for-eviction-if-contains-last-replica"

// current is Longhorn's isSafeAsLastReplica: a copy healthy since it last failed.
func current(r *lh.Replica) bool {
	return r.DeletionTimestamp == nil && r.Spec.NodeID != "" && r.Spec.FailedAt == "" && r.Spec.HealthyAt != "" &&
		(r.Spec.LastFailedAt == "" || r.Spec.LastHealthyAt > r.Spec.LastFailedAt)
}

// evict does what Longhorn's node controller does for a cordoned Kubernetes node while
// node-drain-policy is evictPolicy: each copy there that is its volume's last healthy one is
// rebuilt on a node the scheduler picks (rebuild). The controller runs it in each pass.
func (s *store) evict(ctx context.Context) error {
	api := s.lh.LonghornV1beta2()
	st, err := api.Settings(namespace).Get(ctx, "node-drain-policy", metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && st.Value != evictPolicy {
		return nil
	}
	if err != nil {
		return err
	}
	nodes, err := s.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	cordoned := map[string]bool{}
	for _, n := range nodes.Items {
		cordoned[n.Name] = n.Spec.Unschedulable
	}
	list, err := api.Replicas(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byVolume := map[string][]lh.Replica{}
	for _, r := range list.Items {
		byVolume[r.Spec.VolumeName] = append(byVolume[r.Spec.VolumeName], r)
	}
	var errs []error
	for vol, reps := range byVolume {
		var last *lh.Replica
		healthy := 0
		for i := range reps {
			if current(&reps[i]) {
				healthy++
				last = &reps[i]
			}
		}
		// A copy on a node that is down cannot be read: Longhorn waits for the node.
		if healthy == 1 && cordoned[last.Spec.NodeID] && !last.Spec.EvictionRequested && s.ready(ctx, last.Spec.NodeID) {
			errs = append(errs, s.rebuild(ctx, vol, last, reps))
		}
	}
	return errors.Join(errs...)
}

// rebuild gives the volume a new copy of old's data on another node the scheduler picks (the
// volume's node selector held; none: Longhorn waits for one), as Longhorn rebuilds a copy it
// evicts. A detached volume's data is copied at once and old deleted. An attached volume's engine
// keeps writing old until it detaches: the new copy counts as healthy from now, takes old's data
// at the detach (syncCopies), and old, marked evictionRequested, is deleted then (dropEvicted).
func (s *store) rebuild(ctx context.Context, name string, old *lh.Replica, reps []lh.Replica) error {
	api := s.lh.LonghornV1beta2().Replicas(namespace)
	vol, err := s.volumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ignoreNotFound(err)
	}
	// A copy made by an earlier pass that did not finish is the one to rebuild.
	i := slices.IndexFunc(reps, func(r lh.Replica) bool {
		return r.Spec.NodeID != "" && r.Spec.NodeID != old.Spec.NodeID && r.Spec.FailedAt == "" && r.Spec.HealthyAt == "" && r.DeletionTimestamp == nil
	})
	var target *lh.Replica
	if i >= 0 {
		target = &reps[i]
	} else {
		var exclude []string
		for _, r := range reps {
			exclude = append(exclude, r.Spec.NodeID)
		}
		nodes, err := s.schedule(ctx, vol.Spec.Size, 1, vol.Spec.NodeSelector, vol.Spec.DiskSelector, exclude)
		if err != nil {
			return nil //nolint:nilerr // no node can take the copy yet: Longhorn waits, and so does the next pass
		}
		n := 0
		for slices.ContainsFunc(reps, func(r lh.Replica) bool { return r.Name == replicaName(name, n) }) {
			n++
		}
		if target, err = api.Create(ctx, s.newReplica(vol, n, nodes[0]), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if err := s.waitData(ctx, name); err != nil {
		return err
	}
	detached := vol.Status.State == lh.VolumeStateDetached
	if detached {
		err := s.copyData(ctx, old, target)
		if err := errors.Join(err, s.unserve(ctx, old), s.unserve(ctx, target)); err != nil {
			return err
		}
	}
	t := manager.Now()
	if _, err := s.updateReplica(ctx, target.Name, func(r *lh.Replica) { r.Spec.HealthyAt, r.Spec.LastHealthyAt = t, t }, nil); err != nil {
		return err
	}
	if detached {
		return ignoreNotFound(api.Delete(ctx, old.Name, metav1.DeleteOptions{}))
	}
	_, err = s.updateReplica(ctx, old.Name, func(r *lh.Replica) { r.Spec.EvictionRequested = true }, nil)
	return err
}

// dropEvicted deletes the volume's copies marked evictionRequested whose data another current
// copy now holds: after a detach's syncCopies, the copies rebuild left to it.
func (s *store) dropEvicted(ctx context.Context, vol string) error {
	reps, err := s.replicas(ctx, vol)
	if err != nil {
		return err
	}
	var errs []error
	for i := range reps {
		r := &reps[i]
		others := slices.ContainsFunc(reps, func(o lh.Replica) bool { return o.Name != r.Name && current(&o) })
		if r.Spec.EvictionRequested && others {
			errs = append(errs, ignoreNotFound(s.lh.LonghornV1beta2().Replicas(namespace).Delete(ctx, r.Name, metav1.DeleteOptions{})))
		}
	}
	return errors.Join(errs...)
}
