// Package move is kip service storage longhorn: a service's data moves from its local volume to a
// new single-copy Longhorn volume, verified, resumable, and reversible until it commits (spec 000
// "Move each service's data"). docs/moves.md is the operator's guide.
//
// The steps, each deciding from the cluster's state whether it is done:
//
//	fence   the move annotation on the Service (console-api keeps it stopped), the fence that keeps
//	        every other pod off its claims, the namespace label that keeps it from being deleted;
//	        both enforced, proven by dry-run requests the API server must refuse
//	stop    spec.stopped; wait until no pod of the service is left
//	retain  the old volume's reclaim policy Retain, before any claim is deleted
//	volume  the new claim (kip-move-<service>) on the single-copy Longhorn class, at the planned size
//	copy    the copy pod copies and flushes; out of room, the volume grows once and the copy runs again
//	detach  the copy pod deleted; Longhorn really detached (state, tickets, VolumeAttachment)
//	verify  the verify pod compares the copy, mounted read-only on a fresh mount, with the original
//	commit  the service's claim now names the new volume; the old volume stays, retained, as the copy
//	        kip cluster storage prune deletes later
//	start   the fence lifted, the service started on Longhorn and Ready
package move

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
)

// Class is the StorageClass of a moved service's volume: Longhorn with one copy, data locality
// and auto-balance off.
const Class = cluster.LonghornOneCopyClass

// Annotations kip keeps on the volumes of a move.
const (
	// SizeAnnotation, on the new claim, is the size the move asked for: the planned size, or the
	// grown one, written before the claim is grown.
	SizeAnnotation = "kipper.run/move-size"
	// CopiedAnnotation, on the new claim, is the fence a completed copy was made under (the fence
	// ConfigMap's UID and resourceVersion, and the policies' and bindings' UIDs and generations);
	// a different fence means it was lifted or changed meanwhile.
	CopiedAnnotation = "kipper.run/move-copied"
	// MovedToAnnotation, on the old volume, names the Longhorn volume its data moved to: written
	// at commit, before the old claim is deleted. From then on the move can only go forward.
	MovedToAnnotation = "kipper.run/moved-to"
	// MovedAtAnnotation, written with MovedToAnnotation, is when the move committed (RFC 3339):
	// kip cluster storage prune counts the day from it and wants a backup made after it.
	MovedAtAnnotation = "kipper.run/moved-at"
	// WasStoppedAnnotation, written with MovedToAnnotation when the service was stopped before
	// the move, keeps it stopped at the end of a move that lost its record after its commit.
	WasStoppedAnnotation = "kipper.run/move-was-stopped"
	// ReclaimAnnotation, on the old volume, is its reclaim policy before the move.
	ReclaimAnnotation = "kipper.run/reclaim-policy-before-move"
	// MoveLabel is on the move's own pods and claim, with the service's name.
	MoveLabel = "kipper.run/move"
)

// Timeouts of a move's waits.
const (
	bindTimeout   = 5 * time.Minute
	detachTimeout = 5 * time.Minute
	// A copy or verify runs as long as the data takes; kip waits without a limit, showing what
	// the pod does, and Ctrl-C stops the wait, leaving the pod to finish or be replaced.
	podTimeout = 24 * time.Hour
)

// Options is kip service storage longhorn.
type Options struct {
	Kube     func() (*kube.Clients, error)
	Printer  *cli.Printer
	Prompter *cli.Prompter
	Out      io.Writer
	// Holder names this kip run in the cluster lock and the progress record.
	Holder     string
	KipVersion string
	service.Ref
	// NoBackup moves on a cluster without backups.
	NoBackup bool
	// Rollback undoes an unfinished move.
	Rollback bool
	// Now is the clock; tests pin it.
	Now func() time.Time
	// Server is the server's SSH address as saved for the cluster; "" falls back to the address
	// the cluster record names.
	Server string
	// Deliver puts the mover's image on the node that host reaches over SSH unless it is there
	// (moverpod.Deliver), and reports whether it imported it.
	Deliver func(ctx context.Context, host string) (bool, error)
}

// Intent is what the move decided before it changed anything, kept in its progress record.
type Intent struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	// OldClaim and OldVolume are the service's data claim and its local volume; OldClaimUID tells
	// the original claim from one the StatefulSet recreated.
	OldClaim    string    `json:"oldClaim"`
	OldClaimUID types.UID `json:"oldClaimUID"`
	OldVolume   string    `json:"oldVolume"`
	// NewClaim is the move's own claim on Longhorn, NewVolume its PV once bound.
	NewClaim  string `json:"newClaim"`
	NewVolume string `json:"newVolume,omitempty"`
	// Node is where the local volume lives and the move's pods run.
	Node string `json:"node"`
	// Data is what the scan found; Size the planned size of the new volume.
	Data mover.Totals `json:"data"`
	Size int64        `json:"size"`
	// WasStopped: the service was stopped before the move, and stays so after a rollback.
	WasStopped bool `json:"wasStopped"`
	// Dump is the service's dump claim, recreated empty on Longhorn ("" when none).
	Dump string `json:"dump,omitempty"`
}

// Pod and claim names of a move.
func newClaimName(svc string) string { return "kip-move-" + svc }
func copyPodName(svc string) string  { return "kip-move-copy-" + svc }
func verifyPod(svc string) string    { return "kip-move-verify-" + svc }
func scanPodName(svc string) string  { return "kip-move-scan-" + svc }

// mv is one run of a move.
type mv struct {
	o      *Options
	cl     *kube.Clients
	rec    cluster.Record
	in     *Intent
	svc    *service.Service
	report workflow.Reporter
	// verified is set when this run's verify pod found the copy equal to the original: only a
	// comparison in this run lets the move commit.
	verified bool
	// copied is set when this run copied the data.
	copied bool
	// delivered is set once this run found the mover's image on the move's node or put it there.
	delivered bool
}

func (m *mv) fence() moveguard.Guard {
	return moveguard.Guard{Namespace: m.in.Namespace, Service: m.in.Service,
		Claims:     []string{m.in.OldClaim, m.in.NewClaim},
		Pods:       []string{copyPodName(m.in.Service), verifyPod(m.in.Service)},
		Info:       "kip service info " + m.o.Flags(),
		WasStopped: m.in.WasStopped}
}

func (m *mv) ref() service.Ref { return m.o.Ref }

// steps are the move's steps, in order.
func (m *mv) steps() []workflow.Step {
	s := m.in.Service
	steps := []workflow.Step{
		{Name: "fence", Title: "Fence the volumes of " + s, Done: "Fenced the volumes of " + s + " (no other pod may mount them, the namespace cannot be deleted)",
			Already: "Volumes of " + s + " fenced", Check: m.beforeCommit(m.fenced), Apply: m.putFence},
		{Name: "stop", Title: "Stop service " + s, Done: "Stopped service " + s, Already: "Service " + s + " stopped",
			Check: m.beforeCommit(m.stopped), Apply: m.stop},
		{Name: "retain", Title: "Keep the local volume " + m.in.OldVolume + " when its claim goes", Done: "Local volume " + m.in.OldVolume + " is retained",
			Already: "Local volume " + m.in.OldVolume + " retained", Check: m.beforeCommit(m.retained), Apply: m.retain},
		{Name: "volume", Title: "Create the Longhorn volume", Done: "Created the Longhorn volume", Already: "Longhorn volume created",
			Check: m.beforeCommit(m.volumeReady), Apply: m.createVolume},
		{Name: "copy", Title: "Copy the data of " + s, Done: "Copied the data of " + s, Already: "Data of " + s + " already copied under this fence",
			Check: m.beforeCommit(m.copyKept), Apply: m.copy},
		{Name: "detach", Title: "Detach the Longhorn volume", Done: "Longhorn volume detached", Already: "Longhorn volume detached",
			Check: m.beforeCommit(m.detached), Apply: m.detach},
		{Name: "verify", Title: "Verify the copy against the original", Done: "Verified the copy: every file, owner, mode and checksum matches",
			Already: "Copy verified", Check: m.verifiedCheck, Apply: m.verify},
		{Name: "commit", Title: "Commit the move: the local volume records that its data moved to the Longhorn volume", Done: "Committed the move",
			Already: "Move committed", Check: m.committed, Apply: m.commit},
		{Name: "claim", Title: "Bind the claim of " + s + " to the Longhorn volume", Done: "The claim of " + s + " names the Longhorn volume",
			Already: "The claim of " + s + " names the Longhorn volume", Check: m.claimed, Apply: m.claim},
		{Name: "release", Title: "Give the Longhorn volume its class's reclaim policy and back it up again", Done: "The Longhorn volume has its class's reclaim policy and is backed up",
			Already: "The Longhorn volume has its class's reclaim policy and is backed up", Check: m.released, Apply: m.release},
	}
	if m.in.Dump != "" {
		steps = append(steps, workflow.Step{Name: "dump", Title: "Delete the dump volume of " + s + ", to be made empty on Longhorn",
			Done: "Deleted the dump volume of " + s + ", to be made empty on Longhorn", Already: "The dump volume of " + s + " is made on Longhorn",
			Check: m.dumpRecreated, Apply: m.deleteDump})
	}
	return append(steps, []workflow.Step{
		{Name: "class", Title: "Make Longhorn the storage class of " + s, Done: "Longhorn is the storage class of " + s,
			Already: "Longhorn is the storage class of " + s, Check: m.classSet, Apply: m.setClass},
		{Name: "start", Title: "Start service " + s + " on Longhorn", Done: "Service " + s + " runs on Longhorn", Already: "Service " + s + " runs on Longhorn",
			Check: m.started, Apply: m.start},
	}...)
}

// beforeCommit is check for a step before the commit: done once the move committed, whatever
// the step's own state (the fence is lifted and the move's claim gone by then).
func (m *mv) beforeCommit(check func(context.Context) (bool, error)) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		if done, err := m.committed(ctx); err != nil || done {
			return done, err
		}
		return check(ctx)
	}
}

// ---- fence

func (m *mv) fenced(ctx context.Context) (bool, error) {
	svc, err := service.Get(ctx, m.cl.Dynamic, m.ref())
	if err != nil || svc.Move == "" {
		return false, err
	}
	why, err := m.fence().Intact(ctx, m.cl.Kube)
	if err != nil || why != "" {
		if why != "" {
			m.report.Warn("The fence is not as the move left it: " + why + "; putting it back")
		}
		return false, err
	}
	// Enforced now, not only present: a policy or binding deleted meanwhile shows here.
	return true, moveguard.CheckEnforced(ctx, m.cl.Kube, m.fence(), moveguard.EnforceTimeout)
}

// putFence puts the fence and proves it enforced before anything stops; only then does the move
// annotation tell console-api to keep the service stopped.
func (m *mv) putFence(ctx context.Context) error {
	f := m.fence()
	if err := f.Put(ctx, m.cl.Kube); err != nil {
		return err
	}
	if err := moveguard.CheckEnforced(ctx, m.cl.Kube, f, moveguard.EnforceTimeout); err != nil {
		return fmt.Errorf("%w; kip install applies the policies: re-run it with this kip if they are missing", err)
	}
	return service.SetMove(ctx, m.cl.Dynamic, m.ref(), "longhorn")
}

// ---- stop

func (m *mv) stopped(ctx context.Context) (bool, error) {
	svc, err := service.Get(ctx, m.cl.Dynamic, m.ref())
	if err != nil {
		return false, err
	}
	pods, err := service.Pods(ctx, m.cl.Kube, svc)
	if err != nil {
		return false, err
	}
	return svc.Stopped && svc.Phase == service.PhaseStopped && svc.ObservedGeneration >= svc.Generation && len(pods) == 0, nil
}

func (m *mv) stop(ctx context.Context) error {
	if err := service.SetStopped(ctx, m.cl.Dynamic, m.ref(), true); err != nil {
		return err
	}
	return service.WaitStopped(ctx, m.cl.Dynamic, m.cl.Kube, m.ref(), service.StopTimeout)
}

// ---- retain

func (m *mv) retained(ctx context.Context) (bool, error) {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read the local volume %s: %w", m.in.OldVolume, err)
	}
	return pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain && pv.Annotations[ReclaimAnnotation] != "", nil
}

func (m *mv) retain(ctx context.Context) error {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the local volume %s: %w", m.in.OldVolume, err)
	}
	before := pv.Annotations[ReclaimAnnotation]
	if before == "" {
		before = string(pv.Spec.PersistentVolumeReclaimPolicy)
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{ReclaimAnnotation: before}},
		"spec":     map[string]any{"persistentVolumeReclaimPolicy": corev1.PersistentVolumeReclaimRetain},
	})
	if _, err := m.cl.Kube.CoreV1().PersistentVolumes().Patch(ctx, m.in.OldVolume, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("retain the local volume %s: %w", m.in.OldVolume, err)
	}
	return nil
}

// ---- volume

func (m *mv) newClaim(ctx context.Context) (*corev1.PersistentVolumeClaim, error) {
	c, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace).Get(ctx, m.in.NewClaim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read claim %s/%s: %w", m.in.Namespace, m.in.NewClaim, err)
	}
	return c, nil
}

// askedSize is the size the move asked of the new claim: the recorded one, which a grow changes
// before it grows the claim.
func askedSize(c *corev1.PersistentVolumeClaim, planned int64) int64 {
	var n int64
	if _, err := fmt.Sscan(c.Annotations[SizeAnnotation], &n); err == nil && n > 0 {
		return n
	}
	return planned
}

// nodeResizePending reports that the volume has grown and its file system grows when a pod
// next mounts it (the kubelet grows it before the pod's containers start).
func nodeResizePending(c *corev1.PersistentVolumeClaim) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// requested is the size the claim asks for.
func requested(c *corev1.PersistentVolumeClaim) int64 {
	q := c.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// provisioned is the size the claim's volume has (its status capacity).
func provisioned(c *corev1.PersistentVolumeClaim) int64 {
	q := c.Status.Capacity[corev1.ResourceStorage]
	return q.Value()
}

func (m *mv) volumeReady(ctx context.Context) (bool, error) {
	c, err := m.newClaim(ctx)
	if err != nil || c == nil {
		return false, err
	}
	if c.Status.Phase != corev1.ClaimBound {
		return false, nil
	}
	m.in.NewVolume = c.Spec.VolumeName
	return grown(c, m.in.Size), nil
}

// grown reports whether the claim has the size the move asked for: its volume has it, or has
// grown to it and its file system grows when a pod next mounts it (the claim asks for it, and
// the kubelet's part of the resize is pending).
func grown(c *corev1.PersistentVolumeClaim, planned int64) bool {
	want := askedSize(c, planned)
	return provisioned(c) >= want || requested(c) >= want && nodeResizePending(c)
}

func (m *mv) createVolume(ctx context.Context) error {
	c, err := m.newClaim(ctx)
	if err != nil {
		return err
	}
	if c != nil && askedSize(c, m.in.Size) > requested(c) {
		// A grow recorded its size and stopped before the claim asked for it (killed, or the
		// room or the quota refused it): it is finished first.
		return m.resize(ctx, askedSize(c, m.in.Size))
	}
	if c == nil {
		size := *resource.NewQuantity(m.in.Size, resource.BinarySI)
		c = &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: m.in.NewClaim, Namespace: m.in.Namespace,
				Labels:      map[string]string{MoveLabel: m.in.Service},
				Annotations: map[string]string{SizeAnnotation: fmt.Sprint(m.in.Size)}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(Class),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}
		// The copy's claim and volume are left out of backups: restoring one must never start a copy.
		backup.ExcludeFromBackups(c)
		if _, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace).Create(ctx, c, metav1.CreateOptions{FieldManager: kube.FieldManager}); err != nil {
			return fmt.Errorf("create claim %s/%s: %w", m.in.Namespace, m.in.NewClaim, err)
		}
	}
	return m.waitSize(ctx)
}

// waitSize waits until the new claim is bound at the size the move asked for, and records its
// volume.
func (m *mv) waitSize(ctx context.Context) error {
	return kube.PollPending(ctx, bindTimeout, "claim "+m.in.Namespace+"/"+m.in.NewClaim+" on Longhorn", func(ctx context.Context) (string, error) {
		c, err := m.newClaim(ctx)
		if err != nil || c == nil {
			return "the claim is gone", err
		}
		if c.Status.Phase != corev1.ClaimBound {
			return "the claim is " + string(c.Status.Phase), nil
		}
		m.in.NewVolume = c.Spec.VolumeName
		if !grown(c, m.in.Size) {
			return fmt.Sprintf("the volume has %s of %s", gibText(provisioned(c)), gibText(askedSize(c, m.in.Size))), nil
		}
		return "", m.labelVolume(ctx)
	})
}

// labelVolume leaves the new volume out of backups too.
func (m *mv) labelVolume(ctx context.Context) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true",%q:%q}}}`, velerov1.ExcludeFromBackupLabel, MoveLabel, m.in.Service)
	_, err := m.cl.Kube.CoreV1().PersistentVolumes().Patch(ctx, m.in.NewVolume, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return fmt.Errorf("label volume %s: %w", m.in.NewVolume, err)
	}
	return nil
}

// ---- copy

// fenceMark identifies the fence as it is now: its ConfigMap, and the policies and bindings
// that enforce it. A fence lifted, changed or unenforced at any time since shows as another mark,
// even when it was put back: a pod could have mounted the volume meanwhile.
func (m *mv) fenceMark(ctx context.Context) (string, error) {
	cm, err := m.cl.Kube.CoreV1().ConfigMaps(m.in.Namespace).Get(ctx, moveguard.ConfigMapName(m.in.Service), metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the fence of %s: %w", m.in.Service, err)
	}
	mark := []string{string(cm.UID) + "/" + cm.ResourceVersion}
	ar := m.cl.Kube.AdmissionregistrationV1()
	for _, name := range []string{moveguard.VolumesPolicy, moveguard.NamespacesPolicy} {
		p, err := ar.ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("read admission policy %s: %w", name, err)
		}
		b, err := ar.ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("read admission policy binding %s: %w", name, err)
		}
		mark = append(mark, fmt.Sprintf("%s/%d", p.UID, p.Generation), fmt.Sprintf("%s/%d", b.UID, b.Generation))
	}
	return strings.Join(mark, ","), nil
}

// copyKept reports whether a completed copy can be kept: it was made under the fence that holds
// now, and no pod but the move's own used the volume since.
func (m *mv) copyKept(ctx context.Context) (bool, error) {
	c, err := m.newClaim(ctx)
	if err != nil || c == nil || c.Annotations[CopiedAnnotation] == "" {
		return false, err
	}
	mark, err := m.fenceMark(ctx)
	if err != nil {
		return false, err
	}
	if c.Annotations[CopiedAnnotation] != mark {
		m.report.Warn("The fence was lifted or changed since the data was copied: copying again")
		return false, nil
	}
	users, err := workloads(ctx, m.cl, m.in.NewVolume)
	if err != nil {
		return false, err
	}
	for _, p := range users {
		if p != copyPodName(m.in.Service) && p != verifyPod(m.in.Service) {
			m.report.Warn("Pod " + p + " mounted the Longhorn volume since the data was copied: copying again")
			return false, nil
		}
	}
	return true, nil
}

func (m *mv) copy(ctx context.Context) error {
	if err := m.noOtherPods(ctx); err != nil {
		return err
	}
	if err := m.clearCopied(ctx); err != nil {
		return err
	}
	rep, err := m.runPod(ctx, mover.OpCopy)
	if err != nil {
		return err
	}
	if rep.Result == mover.OutOfSpace {
		if err := m.grow(ctx); err != nil {
			return err
		}
		if rep, err = m.runPod(ctx, mover.OpCopy); err != nil {
			return err
		}
	}
	switch rep.Result {
	case mover.Done:
	case mover.OutOfSpace:
		return m.outOfRoomAgain(rep.Error)
	default:
		return m.stoppedHere("the copy failed: " + reportText(rep))
	}
	mark, err := m.fenceMark(ctx)
	if err != nil {
		return err
	}
	m.copied = true
	return m.annotateNewClaim(ctx, CopiedAnnotation, mark)
}

// noOtherPods refuses to go on while a pod other than the move's own, whoever made it, still
// runs with the service's data claim or the move's claim: the fence refuses new pods, but one
// that ran before it could write to the original after the copy, and those writes would not
// reach Longhorn. A pod that ended can write no more.
func (m *mv) noOtherPods(ctx context.Context) error {
	pods, err := m.cl.Kube.CoreV1().Pods(m.in.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the pods of namespace %s: %w", m.in.Namespace, err)
	}
	own := []string{copyPodName(m.in.Service), verifyPod(m.in.Service), scanPodName(m.in.Service)}
	var users []string
	for _, p := range pods.Items {
		if slices.Contains(own, p.Name) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if c := v.PersistentVolumeClaim; c != nil && (c.ClaimName == m.in.OldClaim || c.ClaimName == m.in.NewClaim) {
				users = append(users, fmt.Sprintf("%s (claim %s)", p.Name, c.ClaimName))
				break
			}
		}
	}
	if len(users) == 0 {
		return nil
	}
	sort.Strings(users)
	return fmt.Errorf("pods of namespace %s other than the move's still use the volumes of service %s: %s; the move keeps every other pod off them: stop those pods, then run 'kip service storage longhorn %s' again (service %s stays stopped meanwhile)",
		m.in.Namespace, m.in.Service, strings.Join(users, ", "), m.o.Flags(), m.in.Service)
}

func (m *mv) clearCopied(ctx context.Context) error {
	return m.annotateNewClaim(ctx, CopiedAnnotation, "")
}

func (m *mv) annotateNewClaim(ctx context.Context, key, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}})
	_, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace).Patch(ctx, m.in.NewClaim, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return fmt.Errorf("annotate claim %s/%s: %w", m.in.Namespace, m.in.NewClaim, err)
	}
	return nil
}

// grow grows the new volume once: the new size is recorded first (so that a run again never
// grows it twice, and finishes this grow in its volume step), then resize.
func (m *mv) grow(ctx context.Context) error {
	c, err := m.newClaim(ctx)
	if err != nil || c == nil {
		return errors.Join(err, fmt.Errorf("claim %s/%s is gone", m.in.Namespace, m.in.NewClaim))
	}
	planned := askedSize(c, m.in.Size)
	if planned > m.in.Size {
		return m.outOfRoomAgain("the volume has " + gibText(planned))
	}
	grown := grownSize(m.in.Size, m.in.Data.Bytes)
	m.report.Warn(fmt.Sprintf("The copy ran out of room on %s: growing the volume once, to %s", gibText(planned), gibText(grown)))
	if err := m.annotateNewClaim(ctx, SizeAnnotation, fmt.Sprint(grown)); err != nil {
		return err
	}
	return m.resize(ctx, grown)
}

// resize grows the new volume to size: Longhorn's room and the quota are checked again (counting
// the dump volume at the new size), the volume is detached, then the claim grows and kip waits
// until the volume has that size.
func (m *mv) resize(ctx context.Context, grown int64) error {
	if err := m.checkGrowRoom(ctx, grown); err != nil {
		return err
	}
	// The copy pod that ran out of room lets go of the volume and Longhorn detaches it first: the
	// volume grows offline, and its file system at the next mount. A pod gone from the API may
	// still have the volume mounted, and a copy pod started on that mount would copy into the
	// file system at its old size.
	if err := m.detach(ctx); err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, resource.NewQuantity(grown, resource.BinarySI).String())
	if _, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace).Patch(ctx, m.in.NewClaim, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("grow claim %s/%s: %w", m.in.Namespace, m.in.NewClaim, err)
	}
	return m.waitSize(ctx)
}

// stoppedHere ends a run whose copy failed: the service stays stopped, its local data as it was,
// and the error names the two commands that go on from here.
func (m *mv) stoppedHere(what string) error {
	cmd := "kip service storage longhorn " + m.o.Flags()
	return fmt.Errorf("%s; service %s stays stopped with its local data untouched: '%s' copies again, '%s --rollback' returns it to its local volume",
		what, m.in.Service, cmd, cmd)
}

func (m *mv) outOfRoomAgain(why string) error {
	return fmt.Errorf("the copy ran out of room on the grown volume too (%s); service %s stays stopped: 'kip service storage longhorn %s --rollback' returns it to its local volume",
		why, m.in.Service, m.o.Flags())
}

// runPod runs one mover pod on the move's node to its end and returns its report; the pod is
// deleted first if an earlier run left one, and afterwards.
func (m *mv) runPod(ctx context.Context, op mover.Op) (*mover.Report, error) {
	name := copyPodName(m.in.Service)
	if op == mover.OpVerify {
		name = verifyPod(m.in.Service)
	}
	if err := m.deletePod(ctx, name); err != nil {
		return nil, err
	}
	if err := m.deliver(ctx); err != nil {
		return nil, err
	}
	claim := func(n string) corev1.VolumeSource {
		return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: n, ReadOnly: op != mover.OpCopy || n == m.in.OldClaim}}
	}
	pod, err := moverpod.Pod(moverpod.Spec{Name: name, Namespace: m.in.Namespace, Op: op, Original: claim(m.in.OldClaim), Copy: claim(m.in.NewClaim),
		Node: m.in.Node, Clean: op == mover.OpCopy, Labels: map[string]string{MoveLabel: m.in.Service}})
	if err != nil {
		return nil, err
	}
	pods := m.cl.Kube.CoreV1().Pods(m.in.Namespace)
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", m.in.Namespace, name, err)
	}
	var rep *mover.Report
	err = kube.PollPending(ctx, podTimeout, "pod "+m.in.Namespace+"/"+name, func(ctx context.Context) (string, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("read pod %s/%s: %w", m.in.Namespace, name, err)
		}
		if p.UID != created.UID {
			return "", fmt.Errorf("pod %s/%s was replaced by another", m.in.Namespace, name)
		}
		r, err := moverpod.Result(ctx, m.cl.Kube, p)
		if err != nil {
			// The pod ended without a report kip can read: the same ways on as after a failed
			// copy or comparison.
			return "", m.stoppedHere(err.Error())
		}
		if rep = r; rep != nil {
			return "", nil
		}
		return podState(p), nil
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

func podState(p *corev1.Pod) string {
	for _, st := range p.Status.ContainerStatuses {
		if w := st.State.Waiting; w != nil {
			return "its container waits: " + w.Reason + " " + w.Message
		}
		if st.State.Running != nil {
			return "it runs"
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			return "it is not scheduled: " + c.Message
		}
	}
	return "it is " + string(p.Status.Phase)
}

func (m *mv) deletePod(ctx context.Context, name string) error {
	pods := m.cl.Kube.CoreV1().Pods(m.in.Namespace)
	err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", m.in.Namespace, name, err)
	}
	return kube.PollPending(ctx, detachTimeout, "pod "+m.in.Namespace+"/"+name+" to be gone", func(ctx context.Context) (string, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "it is still there", err
	})
}

// ---- detach

func (m *mv) detached(ctx context.Context) (bool, error) {
	for _, name := range []string{copyPodName(m.in.Service), verifyPod(m.in.Service)} {
		if _, err := m.cl.Kube.CoreV1().Pods(m.in.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
			return false, nil
		} else if !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	pending, err := detachPending(ctx, m.cl, m.in.NewVolume, m.longhornVolume())
	return err == nil && pending == "", err
}

// longhornVolume is the Longhorn volume of the new PV: Longhorn names it as the PV.
func (m *mv) longhornVolume() string { return m.in.NewVolume }

func (m *mv) detach(ctx context.Context) error {
	for _, name := range []string{copyPodName(m.in.Service), verifyPod(m.in.Service)} {
		if err := m.deletePod(ctx, name); err != nil {
			return err
		}
	}
	return kube.PollPending(ctx, detachTimeout, "Longhorn to detach volume "+m.longhornVolume(), func(ctx context.Context) (string, error) {
		return detachPending(ctx, m.cl, m.in.NewVolume, m.longhornVolume())
	})
}

// ---- verify

func (m *mv) verifiedCheck(ctx context.Context) (bool, error) {
	if m.verified {
		return true, nil
	}
	// Committed already: the verify that let it commit happened in an earlier run.
	return m.committed(ctx)
}

func (m *mv) verify(ctx context.Context) error {
	rep, err := m.runPod(ctx, mover.OpVerify)
	if err != nil {
		return err
	}
	if rep.Result == mover.Differ && !m.copied {
		// A copy kept from an earlier run no longer matches: a pod wrote to it while kip was away.
		m.report.Warn("The copy kept from an earlier run no longer matches the original (" + reportText(rep) + "): copying again")
		if err := m.copy(ctx); err != nil {
			return err
		}
		if err := m.detach(ctx); err != nil {
			return err
		}
		if rep, err = m.runPod(ctx, mover.OpVerify); err != nil {
			return err
		}
	}
	if rep.Result != mover.Done {
		if err := m.clearCopied(ctx); err != nil {
			return err
		}
		return m.stoppedHere("the copy does not match the original: " + reportText(rep))
	}
	if err := m.deletePod(ctx, verifyPod(m.in.Service)); err != nil {
		return err
	}
	m.verified = true
	return nil
}

// reportText is what a mover report says, for an error: its result, its error, and the first
// differences.
func reportText(r *mover.Report) string {
	var parts []string
	if r.Result != mover.Differ {
		parts = append(parts, string(r.Result))
	}
	if r.Error != "" {
		parts = append(parts, r.Error)
	}
	if r.DifferenceCount > 0 {
		var diffs []string
		for _, d := range r.Differences {
			diffs = append(diffs, d.String())
		}
		if n := r.DifferenceCount - int64(len(r.Differences)); n > 0 {
			diffs = append(diffs, fmt.Sprintf("and %d more", n))
		}
		parts = append(parts, cli.Count(int(r.DifferenceCount), "difference", "differences")+": "+strings.Join(diffs, "; "))
	}
	return strings.Join(parts, ": ")
}

// ---- commit

// committed reports whether the move passed its commit point: the old volume records where its
// data went. From then on every step before the commit counts as done and the move only goes
// forward, whatever a later step left half-done.
func (m *mv) committed(ctx context.Context) (bool, error) {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read the local volume %s: %w", m.in.OldVolume, err)
	}
	return pv.Annotations[MovedToAnnotation] != "", nil
}

// commit passes the commit point. The new volume is set to survive the deletion of its claim
// first (its policy before kept in an annotation, so that a second run keeps the first's), then
// the old volume records where its data went.
func (m *mv) commit(ctx context.Context) error {
	if err := m.noOtherPods(ctx); err != nil {
		return err
	}
	newPV, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.NewVolume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the Longhorn volume %s: %w", m.in.NewVolume, err)
	}
	reclaim := newPV.Annotations[ReclaimAnnotation]
	if reclaim == "" {
		reclaim = string(newPV.Spec.PersistentVolumeReclaimPolicy)
	}
	if err := m.patchPV(ctx, m.in.NewVolume, map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{ReclaimAnnotation: reclaim}},
		"spec":     map[string]any{"persistentVolumeReclaimPolicy": corev1.PersistentVolumeReclaimRetain}}); err != nil {
		return err
	}
	marks := map[string]string{MovedToAnnotation: m.in.NewVolume, MovedAtAnnotation: m.o.now().UTC().Format(time.RFC3339)}
	if m.in.WasStopped {
		marks[WasStoppedAnnotation] = "true"
	}
	return m.patchPV(ctx, m.in.OldVolume, map[string]any{"metadata": map[string]any{"annotations": marks}})
}

// ---- claim

// claimed reports whether the service's claim is bound to the new volume and the move's own
// claim is gone.
func (m *mv) claimed(ctx context.Context) (bool, error) {
	claims := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace)
	if c, err := m.newClaim(ctx); err != nil || c != nil {
		return false, err
	}
	c, err := claims.Get(ctx, m.in.OldClaim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read claim %s/%s: %w", m.in.Namespace, m.in.OldClaim, err)
	}
	return c.Spec.VolumeName == m.in.NewVolume && c.Status.Phase == corev1.ClaimBound, nil
}

// claim makes the service's claim name the new volume, each write found done when a run before
// made it: the move's own claim goes (its volume retained); the service's claim goes, whether the
// original or an empty one the StatefulSet recreated, unless it already names the new volume;
// the new volume is bound in advance to a claim of the service's name, and that claim made.
func (m *mv) claim(ctx context.Context) error {
	claims := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace)
	if err := m.stillRetained(ctx, m.in.NewVolume); err != nil {
		return err
	}
	if err := deleteClaim(ctx, claims, m.in.NewClaim, ""); err != nil {
		return err
	}
	c, err := claims.Get(ctx, m.in.OldClaim, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c = nil
	case err != nil:
		return fmt.Errorf("read claim %s/%s: %w", m.in.Namespace, m.in.OldClaim, err)
	case c.Spec.VolumeName != m.in.NewVolume:
		if c.UID != m.in.OldClaimUID {
			m.report.Warn(fmt.Sprintf("Deleting claim %s/%s, which the StatefulSet recreated while the move ran (it is not the original)", m.in.Namespace, m.in.OldClaim))
		} else if err := m.stillRetained(ctx, m.in.OldVolume); err != nil {
			return err
		}
		if err := deleteClaim(ctx, claims, m.in.OldClaim, c.UID); err != nil {
			return err
		}
		c = nil
	}
	if c == nil {
		newPV, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.NewVolume, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read the Longhorn volume %s: %w", m.in.NewVolume, err)
		}
		if ref := newPV.Spec.ClaimRef; ref == nil || ref.Namespace != m.in.Namespace || ref.Name != m.in.OldClaim {
			if err := m.patchPV(ctx, m.in.NewVolume, map[string]any{"spec": map[string]any{"claimRef": map[string]any{
				"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": m.in.Namespace, "name": m.in.OldClaim,
				"uid": nil, "resourceVersion": nil}}}); err != nil {
				return err
			}
		}
		want := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: m.in.OldClaim, Namespace: m.in.Namespace, Labels: map[string]string{service.Label: m.in.Service}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(Class),
				VolumeName:       m.in.NewVolume,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: newPV.Spec.Capacity[corev1.ResourceStorage]}},
			},
		}
		if _, err := claims.Create(ctx, want, metav1.CreateOptions{FieldManager: kube.FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create claim %s/%s: %w", m.in.Namespace, m.in.OldClaim, err)
		}
	}
	return kube.PollPending(ctx, bindTimeout, "claim "+m.in.Namespace+"/"+m.in.OldClaim+" to bind to "+m.in.NewVolume, func(ctx context.Context) (string, error) {
		c, err := claims.Get(ctx, m.in.OldClaim, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if c.Spec.VolumeName != m.in.NewVolume {
			return "", fmt.Errorf("claim %s/%s was created bound to %q, not %s: don't create volumes for a service while its move runs", m.in.Namespace, m.in.OldClaim, c.Spec.VolumeName, m.in.NewVolume)
		}
		if c.Status.Phase != corev1.ClaimBound {
			return "it is " + string(c.Status.Phase), nil
		}
		return "", nil
	})
}

// stillRetained makes sure, right before a claim of volume name is deleted, that the volume's
// reclaim policy is still the Retain the move set: changed since, the claim's deletion would
// delete the data with it.
func (m *mv) stillRetained(ctx context.Context, name string) error {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read volume %s: %w", name, err)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain {
		return nil
	}
	m.report.Warn(fmt.Sprintf("Volume %s's reclaim policy is %s again, not the Retain the move set: setting Retain before its claim is deleted, which would delete its data",
		name, pv.Spec.PersistentVolumeReclaimPolicy))
	return m.patchPV(ctx, name, map[string]any{"spec": map[string]any{"persistentVolumeReclaimPolicy": corev1.PersistentVolumeReclaimRetain}})
}

// ---- release

// released reports whether the new volume is again what its class makes it: its policy from
// before the commit, in backups, no longer the move's.
func (m *mv) released(ctx context.Context) (bool, error) {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.NewVolume, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read the Longhorn volume %s: %w", m.in.NewVolume, err)
	}
	_, excluded := pv.Labels[velerov1.ExcludeFromBackupLabel]
	_, moving := pv.Labels[MoveLabel]
	_, kept := pv.Annotations[ReclaimAnnotation]
	return !excluded && !moving && !kept, nil
}

// release gives the new volume its policy from before the commit (Delete, on Longhorn's classes)
// and puts it back in backups, in one write.
func (m *mv) release(ctx context.Context) error {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.NewVolume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the Longhorn volume %s: %w", m.in.NewVolume, err)
	}
	patch := map[string]any{"metadata": map[string]any{"labels": map[string]any{velerov1.ExcludeFromBackupLabel: nil, MoveLabel: nil},
		"annotations": map[string]any{ReclaimAnnotation: nil}}}
	if reclaim := pv.Annotations[ReclaimAnnotation]; reclaim != "" {
		patch["spec"] = map[string]any{"persistentVolumeReclaimPolicy": reclaim}
	}
	return m.patchPV(ctx, m.in.NewVolume, patch)
}

// ---- dump

// dumpRecreated reports whether the service's dump claim is gone, to be made again on Longhorn
// when the service starts, or already made there.
func (m *mv) dumpRecreated(ctx context.Context) (bool, error) {
	c, err := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace).Get(ctx, m.in.Dump, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read claim %s/%s: %w", m.in.Namespace, m.in.Dump, err)
	}
	return ptr.Deref(c.Spec.StorageClassName, "") == Class, nil
}

func (m *mv) deleteDump(ctx context.Context) error {
	return deleteClaim(ctx, m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace), m.in.Dump, "")
}

// ---- class

func (m *mv) classSet(ctx context.Context) (bool, error) {
	svc, err := service.Get(ctx, m.cl.Dynamic, m.ref())
	if err != nil {
		return false, err
	}
	return svc.StorageClass == Class, nil
}

func (m *mv) setClass(ctx context.Context) error {
	return service.SetStorageClass(ctx, m.cl.Dynamic, m.ref(), Class)
}

func (m *mv) patchPV(ctx context.Context, name string, patch map[string]any) error {
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := m.cl.Kube.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, raw, metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("update volume %s: %w", name, err)
	}
	return nil
}

// ---- start

func (m *mv) started(ctx context.Context) (bool, error) {
	svc, err := service.Get(ctx, m.cl.Dynamic, m.ref())
	if err != nil {
		return false, err
	}
	if svc.FenceStop != "" {
		// kip node fence stopped it meanwhile: it stays stopped until the fence's check lets it start.
		return svc.Move == "" && svc.Stopped, nil
	}
	if svc.Move != "" || svc.Stopped != m.in.WasStopped {
		return false, nil
	}
	if lifted, err := moveguard.Lifted(ctx, m.cl.Kube, m.in.Namespace, m.in.Service); err != nil || !lifted {
		return false, err // still fenced, or in part
	}
	return m.in.WasStopped || svc.Phase == service.PhaseRunning && svc.ObservedGeneration >= svc.Generation, nil
}

func (m *mv) start(ctx context.Context) error {
	svc, err := service.Get(ctx, m.cl.Dynamic, m.ref())
	if err != nil {
		return err
	}
	// spec.stopped goes first, while the move annotation still keeps the service stopped: once
	// the annotation goes, nothing is left to do, even for a run that lost the move's record.
	run := !m.in.WasStopped && svc.FenceStop == ""
	if run {
		if err := service.SetStopped(ctx, m.cl.Dynamic, m.ref(), false); err != nil {
			return err
		}
	}
	if err := moveguard.Lift(ctx, m.cl.Kube, m.in.Namespace, m.in.Service); err != nil {
		return err
	}
	if err := service.SetMove(ctx, m.cl.Dynamic, m.ref(), ""); err != nil {
		return err
	}
	switch {
	case m.in.WasStopped:
		m.report.Info("The service was stopped before the move and stays stopped: 'kip service start " + m.o.Flags() + "' starts it")
		return nil
	case !run:
		m.report.Warn("kip node fence of " + svc.FenceStop + " stopped the service, and it stays stopped: 'kip service start " + m.o.Flags() + "' starts it after the fence's copies check")
		return nil
	}
	return service.WaitRunning(ctx, m.cl.Dynamic, m.cl.Kube, m.ref(), service.StartTimeout)
}

// deleteClaim deletes a claim (with uid as a precondition when set) and waits until it is gone.
func deleteClaim(ctx context.Context, claims interface {
	Delete(context.Context, string, metav1.DeleteOptions) error
	Get(context.Context, string, metav1.GetOptions) (*corev1.PersistentVolumeClaim, error)
}, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := claims.Delete(ctx, name, opts); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete claim %s: %w", name, err)
	}
	return kube.PollPending(ctx, bindTimeout, "claim "+name+" to be gone", func(ctx context.Context) (string, error) {
		c, err := claims.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return "", nil
		case err != nil:
			return "", err
		case uid != "" && c.UID != uid:
			return "", nil // a newer claim of that name; commit deals with it
		}
		return "it is still there (a pod may still use it)", nil
	})
}
