package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/longhorn-standin/manager"
)

// How the plugins of the copies' nodes and the controller (the server's plugin) work together,
// through annotations, as Longhorn's managers do through their objects.
const (
	// annotationServe on a Replica asks its node's plugin to serve the copy's data to the node it
	// names, on a loop device (keepCopies).
	annotationServe = "standin.longhorn.io/serve-to"
	// annotationLoop on a Replica is the number of the loop device its node's plugin serves the
	// copy on.
	annotationLoop = "standin.longhorn.io/loop"
	// annotationPrimary on a Volume names the copy whose data its attached engine serves.
	annotationPrimary = "standin.longhorn.io/primary"
)

// serveTimeout bounds the wait for another node's plugin to serve a copy.
const serveTimeout = time.Minute

// schedule picks nodes for copies of a volume of size (at most copies, one per node), as
// Longhorn's replica scheduler does (longhorn-manager scheduler/replica_scheduler.go): nodes
// whose Longhorn Node and disk allow scheduling, not being evicted, Ready in Kubernetes, holding
// every tag of the volume's node selector on the node and of its disk selector on the disk,
// with room for size, and none in exclude (those holding a copy of it already); then the disk
// with the most usable storage first, as Longhorn's getDiskWithMostUsableStorage picks (ties by
// node name: Longhorn's pick among equal disks is a map's order). It refuses when no node
// qualifies.
func (s *store) schedule(ctx context.Context, size int64, copies int, nodeSelector, diskSelector, exclude []string) ([]string, error) {
	nodes, err := s.lh.LonghornV1beta2().Nodes(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	holds := func(have, want []string) bool {
		return !slices.ContainsFunc(want, func(tag string) bool { return !slices.Contains(have, tag) })
	}
	type candidate struct {
		name string
		room int64
	}
	var fit []candidate
	var full []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		disk := n.Spec.Disks[defaultDisk]
		if slices.Contains(exclude, n.Name) || !holds(n.Spec.Tags, nodeSelector) || !holds(disk.Tags, diskSelector) || !n.Spec.AllowScheduling ||
			n.Spec.EvictionRequested || !disk.AllowScheduling || disk.EvictionRequested || !s.ready(ctx, n.Name) {
			continue
		}
		room, err := s.room(ctx, n)
		if err != nil {
			return nil, err
		}
		if size > room {
			full = append(full, fmt.Sprintf("%s has %d bytes schedulable", n.Name, room))
			continue
		}
		fit = append(fit, candidate{n.Name, room})
	}
	if len(fit) == 0 {
		return nil, fmt.Errorf("%w: cannot schedule %d bytes to disk %s of any node: %v", errNoRoom, size, defaultDisk, full)
	}
	slices.SortFunc(fit, func(a, b candidate) int { return cmp.Or(-cmp.Compare(a.room, b.room), cmp.Compare(a.name, b.name)) })
	var picked []string
	for _, c := range fit[:min(copies, len(fit))] {
		picked = append(picked, c.name)
	}
	return picked, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ready reports whether node's Kubernetes Node is Ready: this node's is taken to be, its plugin
// running.
func (s *store) ready(ctx context.Context, node string) bool {
	if node == s.node {
		return true
	}
	n, err := s.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// usableCopies are the volume's copies an engine attaching now can run: scheduled, not failed,
// on a Ready node. A copy on a node that is not Ready is marked failed (failedAt and lastFailedAt
// now), as Longhorn's engine marks a replica it cannot reach. With none left, the failed copy on
// a Ready node healthy last (failed last, of those healthy in the same second) is salvaged (its
// failedAt cleared), as Longhorn's auto-salvage does.
func (s *store) usableCopies(ctx context.Context, vol string) ([]*lh.Replica, error) {
	reps, err := s.replicas(ctx, vol)
	if err != nil {
		return nil, err
	}
	var usable, failed []*lh.Replica
	for i := range reps {
		r := &reps[i]
		switch {
		case r.Spec.NodeID == "" || r.DeletionTimestamp != nil:
		case !s.ready(ctx, r.Spec.NodeID):
			if r.Spec.FailedAt == "" {
				if err := s.setFailed(ctx, r, manager.Now()); err != nil {
					return nil, err
				}
			}
		case r.Spec.FailedAt != "":
			failed = append(failed, r)
		default:
			usable = append(usable, r)
		}
	}
	if len(usable) == 0 && len(failed) > 0 {
		slices.SortFunc(failed, func(a, b *lh.Replica) int {
			return -cmp.Or(cmp.Compare(a.Spec.LastHealthyAt, b.Spec.LastHealthyAt), cmp.Compare(a.Spec.LastFailedAt, b.Spec.LastFailedAt))
		})
		if err := s.setFailed(ctx, failed[0], ""); err != nil {
			return nil, err
		}
		usable = failed[:1]
	}
	if len(usable) == 0 {
		return nil, fmt.Errorf("%w: no copy of volume %s is on a Ready node", errBusy, vol)
	}
	return usable, nil
}

// setFailed sets a copy's failedAt (and lastFailedAt with it) to at, or clears failedAt when at
// is "".
func (s *store) setFailed(ctx context.Context, r *lh.Replica, at string) error {
	got, err := s.updateReplica(ctx, r.Name, func(latest *lh.Replica) {
		latest.Spec.FailedAt = at
		if at != "" {
			latest.Spec.LastFailedAt = at
		}
	}, nil)
	if err == nil {
		*r = *got
	}
	return err
}

// updateReplica changes Replica name's spec with change and then, unless status is nil, its
// status with status, each on the latest Replica: the plugins of other nodes annotate Replicas
// (serve and keepCopies) while this one works on them.
func (s *store) updateReplica(ctx context.Context, name string, change, status func(*lh.Replica)) (*lh.Replica, error) {
	api := s.lh.LonghornV1beta2().Replicas(namespace)
	var r *lh.Replica
	for _, w := range []struct {
		edit  func(*lh.Replica)
		write func(context.Context, *lh.Replica, metav1.UpdateOptions) (*lh.Replica, error)
	}{{change, api.Update}, {status, api.UpdateStatus}} {
		if w.edit == nil {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			var err error
			if r, err = api.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
			w.edit(r)
			r, err = w.write(ctx, r, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// choosePrimary picks the copy whose data an engine on node serves: one on another node when
// there is one (this node's first, then by node name), else the copy on node. The stand-in
// keeps a volume's data in one copy while it is attached (the others take it at the detach), so
// it keeps it off the engine's node: when that node dies with the volume attached, as a fence
// follows, a copy the stand-in reports current elsewhere holds every write.
func choosePrimary(usable []*lh.Replica, node, self string) *lh.Replica {
	sorted := slices.Clone(usable)
	slices.SortFunc(sorted, func(a, b *lh.Replica) int {
		return cmp.Or(cmp.Compare(boolInt(a.Spec.NodeID == node), boolInt(b.Spec.NodeID == node)),
			-cmp.Compare(boolInt(a.Spec.NodeID == self), boolInt(b.Spec.NodeID == self)), cmp.Compare(a.Spec.NodeID, b.Spec.NodeID))
	})
	return sorted[0]
}

// keepCopies does, for the copies on this node, what Longhorn's replica instances do: it makes
// the data of a new copy (an image of its size holding an ext4 file system) and grows the image
// of one whose volume grew, marks each made (status.ownerID, its node); it serves a copy's image
// on a loop device while annotationServe asks for it, publishing the device's number
// (annotationLoop), and detaches the device once the annotation goes; and it removes the data of
// copies whose Replicas are gone.
func (s *store) keepCopies(ctx context.Context) error {
	api := s.lh.LonghornV1beta2().Replicas(namespace)
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	mine := map[string]bool{}
	var errs []error
	for i := range list.Items {
		r := &list.Items[i]
		if r.Spec.NodeID != s.node || r.Spec.DataDirectoryName == "" {
			continue
		}
		mine[r.Spec.DataDirectoryName] = true
		errs = append(errs, s.keepCopy(ctx, r))
	}
	dirs, err := os.ReadDir(filepath.Join(s.root, "replicas"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errors.Join(append(errs, err)...)
	}
	for _, d := range dirs {
		dir := d.Name()
		if mine[dir] {
			continue
		}
		img := s.imageOf(dir)
		if dev := s.exported[dir]; dev != nil { // served until its Replica went
			dev.Close() //nolint:errcheck // release detaches the device itself
			delete(s.exported, dir)
			errs = append(errs, release(img))
		}
		if loop.Find(img) < 0 {
			errs = append(errs, os.RemoveAll(filepath.Dir(img)))
		}
	}
	return errors.Join(errs...)
}

// keepCopy makes, grows and serves the data of r, a copy on this node (keepCopies).
func (s *store) keepCopy(ctx context.Context, r *lh.Replica) error {
	dir := r.Spec.DataDirectoryName
	img := s.imageOf(dir)
	st, err := os.Stat(img)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := makeImage(ctx, img, r.Spec.VolumeSize); err != nil {
			return err
		}
	case err != nil:
		return err
	case st.Size() < r.Spec.VolumeSize:
		if err := os.Truncate(img, r.Spec.VolumeSize); err != nil {
			return err
		}
	}
	if r.Status.OwnerID != s.node {
		r.Status.OwnerID = s.node
		if r.Status.CurrentState == "" {
			r.Status.CurrentState = lh.InstanceStateStopped
		}
		if _, err := s.lh.LonghornV1beta2().Replicas(namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{}); err != nil {
			return ignoreConflict(err)
		}
	}
	d := s.exported[dir]
	if r.Annotations[annotationServe] == "" {
		if d == nil {
			return nil
		}
		d.Close() //nolint:errcheck // release detaches the device itself
		delete(s.exported, dir)
		if err := release(img); err != nil {
			return err
		}
		return s.annotate(ctx, r.Name, annotationLoop, "")
	}
	if d == nil || !d.BoundTo(img) {
		if d != nil {
			d.Close() //nolint:errcheck // no longer bound to the image
		}
		// A device left bound to the image (by an earlier run of the plugin) goes first, so that
		// no two devices share it; a volume expanded meanwhile grows first.
		if err := release(img); err != nil {
			return err
		}
		if err := growFS(ctx, img); err != nil {
			return err
		}
		if d, err = loop.Attach(img); err != nil {
			return err
		}
		s.exported[dir] = d
	}
	if n := strconv.Itoa(d.Number); r.Annotations[annotationLoop] != n {
		return s.annotate(ctx, r.Name, annotationLoop, n)
	}
	return nil
}

// annotate sets (value "" removes) one annotation of a Replica.
func (s *store) annotate(ctx context.Context, replica, key, value string) error {
	v := "null"
	if value != "" {
		v = strconv.Quote(value)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, key, v)
	_, err := s.lh.LonghornV1beta2().Replicas(namespace).Patch(ctx, replica, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// serve has r's node serve its data to node on a loop device, and returns the device's number:
// this node's plugin at once, another's within a pass of its plugin. Loop devices are the
// kernel's, shared by every lab host, so node reaches the copy by that number, as Longhorn's
// engine reaches a replica over the network.
func (s *store) serve(ctx context.Context, r *lh.Replica, node string) (int, error) {
	api := s.lh.LonghornV1beta2().Replicas(namespace)
	if r.Annotations[annotationServe] != node {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:null}}}`, annotationServe, node, annotationLoop)
		if _, err := api.Patch(ctx, r.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return 0, err
		}
	}
	if r.Spec.NodeID == s.node {
		if err := s.keepCopies(ctx); err != nil {
			return 0, err
		}
	}
	n := -1
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, serveTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := api.Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if l, ok := got.Annotations[annotationLoop]; ok {
			n, err = strconv.Atoi(l)
			return err == nil, err
		}
		return false, nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w: node %s has not served copy %s: %v", errBusy, r.Spec.NodeID, r.Name, err)
	}
	return n, nil
}

// unserve has r's node stop serving its data: this node's plugin at once, another's at its next
// pass.
func (s *store) unserve(ctx context.Context, r *lh.Replica) error {
	if err := s.annotate(ctx, r.Name, annotationServe, ""); err != nil {
		return ignoreNotFound(err)
	}
	if r.Spec.NodeID == s.node {
		return s.keepCopies(ctx)
	}
	return nil
}

// syncCopies gives the volume's other copies that have not failed the data of the copy its
// engine served (primary), once its file system is unmounted: the stand-in writes a volume's
// data to that one copy while it is attached, where Longhorn's engine writes every copy at once.
// A copy on a node that is not Ready is marked failed instead; when the primary's node is not
// Ready, nothing can be read, and the other copies keep what they hold. Every device serving
// the volume's copies is detached after.
func (s *store) syncCopies(ctx context.Context, vol *lh.Volume) error {
	reps, err := s.replicas(ctx, vol.Name)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(reps, func(r lh.Replica) bool { return r.Name == vol.Annotations[annotationPrimary] })
	var errs []error
	if i >= 0 && s.ready(ctx, reps[i].Spec.NodeID) {
		primary := &reps[i]
		for j := range reps {
			r := &reps[j]
			switch {
			case j == i || r.Spec.NodeID == "" || r.Spec.FailedAt != "" || r.DeletionTimestamp != nil:
			case !s.ready(ctx, r.Spec.NodeID):
				errs = append(errs, s.setFailed(ctx, r, manager.Now()))
			default:
				errs = append(errs, s.copyData(ctx, primary, r))
			}
		}
	}
	for j := range reps {
		errs = append(errs, s.unserve(ctx, &reps[j]))
	}
	return errors.Join(errs...)
}

// copyData copies the data of copy from into copy to, each read or written on this node: its
// image when the copy is here, else the loop device its node serves it on.
func (s *store) copyData(ctx context.Context, from, to *lh.Replica) error {
	src, closeSrc, err := s.open(ctx, from)
	if err != nil {
		return err
	}
	defer closeSrc()
	dst, closeDst, err := s.open(ctx, to)
	if err != nil {
		return err
	}
	defer closeDst()
	if _, err := io.Copy(dst, io.NewSectionReader(src, 0, from.Spec.VolumeSize)); err != nil {
		return fmt.Errorf("copy the data of %s to %s: %w", from.Name, to.Name, err)
	}
	return dst.Sync()
}

// open opens a copy's data for reading and writing on this node (copyData); the func closes it.
// A copy another node serves must still be served from an image of its data directory's path.
func (s *store) open(ctx context.Context, r *lh.Replica) (*os.File, func(), error) {
	img := s.imageOf(r.Spec.DataDirectoryName)
	if r.Spec.NodeID == s.node {
		if d := s.exported[r.Spec.DataDirectoryName]; d != nil { // served to the engine's node until now
			d.Close() //nolint:errcheck // release detaches the device itself
			delete(s.exported, r.Spec.DataDirectoryName)
		}
		if err := release(img); err != nil {
			return nil, nil, err
		}
		f, err := os.OpenFile(img, os.O_RDWR, 0)
		if err != nil {
			return nil, nil, err
		}
		return f, func() { f.Close() }, nil //nolint:errcheck // written and synced by then
	}
	n, err := s.serve(ctx, r, s.node)
	if err != nil {
		return nil, nil, err
	}
	if got := loop.Backing(loop.SysBlock)[n]; got != img {
		return nil, nil, fmt.Errorf("%w: loop device %d serves %q, not copy %s's %s", errBusy, n, got, r.Name, img)
	}
	d, err := loop.Open(n)
	if err != nil {
		return nil, nil, err
	}
	return d.File(), func() {
		d.Close()             //nolint:errcheck // its node's plugin detaches it
		loop.DropNode(d.Path) //nolint:errcheck // a node left in this host's /dev serves nothing once detached
	}, nil
}
