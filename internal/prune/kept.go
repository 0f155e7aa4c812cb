// Package prune decides which local copies that moves to Longhorn left behind may go, says why
// each other one is kept, and deletes them: kip cluster storage prune, and the kept copies of
// kip status. docs/prune.md documents the rules.
package prune

import (
	"context"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/move"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
)

const (
	// ReadyFor is how long a moved service's pod must have been Ready on Longhorn.
	ReadyFor = time.Hour
	// Grace is how long after a move its copy stays without a backup made since.
	Grace = 24 * time.Hour
	// StartedAnnotation is on a copy's PersistentVolume once a prune is about to delete its
	// directory. It decides nothing alone: the next prune finishes the copy without checks only
	// when the directory is gone from its path on the host (the delete renames it first), and
	// judges it as any other copy while the directory is there.
	StartedAnnotation = "kipper.run/prune-started"
)

// Kind says what a copy is to prune.
type Kind string

const (
	// KindMoved is the local copy of a moved service's data: deleted when every condition holds
	// ("copy" in kip status -o json).
	KindMoved Kind = "copy"
	// KindOrphan is a copy whose service and data claim are both gone: deleted without checks.
	KindOrphan Kind = "orphan"
	// KindInterrupted is a copy whose deletion started on the host and did not finish (its
	// directory is gone from its path): finished without checks, since it may be partly gone.
	// Only a prune, which looks on the host, finds it.
	KindInterrupted Kind = "interrupted"
)

// The conditions a copy must meet, as Hold.Condition names them.
const (
	// CondMoved: the service still has its data on the Longhorn volume the move verified, and the
	// move finished.
	CondMoved = "moved"
	// CondReplaced: the service lost or replaced that volume; never waived.
	CondReplaced = "replaced"
	// CondReady: the service's pod uses that volume and has been Ready for ReadyFor; waived by
	// --delete-unproven for a named service.
	CondReady = "ready"
	// CondBackup: a completed backup made after the move holds the service's data from Longhorn,
	// or Grace has passed since the move; waived by --now.
	CondBackup = "backup"
	// CondCopies: no change of the volume's copy count is under way; never waived.
	CondCopies = "copies"
)

// Kept is one local volume a move kept (a "local copy" in kip's messages), with what holds it
// back. In kip's code a copy count is a Longhorn volume's replica count (service.Copies), a
// replica is longhorn.Replica, and a kept local volume is Kept.
type Kept struct {
	// Volume is the retained local PersistentVolume; Node and Path are where its directory is.
	Volume string `json:"volume"`
	Node   string `json:"node"`
	Path   string `json:"path"`
	// Namespace and Claim are the claim the volume belonged to, the service's data claim.
	Namespace string `json:"namespace"`
	Claim     string `json:"claim"`
	// Service is the service whose data it was, nil when no service uses that claim any more.
	Service *service.Ref `json:"service,omitempty"`
	// MovedTo is the Longhorn volume the move verified the data on, MovedAt when it committed.
	MovedTo string     `json:"movedTo"`
	MovedAt *time.Time `json:"movedAt,omitempty"`
	Kind    Kind       `json:"kind"`
	// SizeBytes is the volume's declared size; kip status adds the space its directory uses.
	SizeBytes int64  `json:"sizeBytes"`
	UsedBytes *int64 `json:"usedBytes,omitempty"`
	// Holds are the conditions that do not hold yet, empty when it may be deleted.
	Holds []Hold `json:"holds,omitempty"`
	// DeleteStarted says that a prune marked it (StartedAnnotation) and was interrupted.
	DeleteStarted bool `json:"deleteStarted,omitempty"`
}

// Hold is one condition a copy does not meet yet.
type Hold struct {
	Condition string `json:"condition"`
	// Reason says why, and what would change it.
	Reason string `json:"reason"`
	// Until is when the condition will hold by itself, if nothing else changes.
	Until *time.Time `json:"until,omitempty"`
}

// Waivers are the holds an operator waives for a prune.
type Waivers struct {
	// Now waives the wait for a backup or a day (--now).
	Now bool
	// Unproven waives the health check (--delete-unproven, for one named service).
	Unproven bool
}

// waives reports whether w waives h.
func (w Waivers) waives(h Hold) bool {
	return (h.Condition == CondBackup && w.Now) || (h.Condition == CondReady && w.Unproven)
}

// Deletable reports whether c may be deleted with w: an orphan or an interrupted deletion always,
// a copy when w waives every hold.
func (c *Kept) Deletable(w Waivers) bool {
	return !slices.ContainsFunc(c.Holds, func(h Hold) bool { return !w.waives(h) })
}

// Of reports whether c is the copy of a service named name in project (and environment, when
// not "").
func (c *Kept) Of(name, project, environment string) bool {
	s := c.Service
	return s != nil && s.Name == name && s.Project == project && (environment == "" || s.Environment == environment)
}

// What names the copy for a person: its service, or its claim when no service uses it.
func (c *Kept) What() string {
	if c.Service != nil {
		return c.Service.String()
	}
	return "claim " + c.Namespace + "/" + c.Claim
}

// Read lists every kept copy of the cluster with its holds at now, sorted by service.
func Read(ctx context.Context, cl *kube.Clients, rec cluster.Record, now time.Time) ([]Kept, error) {
	pvs, err := cl.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list persistent volumes: %w", err)
	}
	return FromVolumes(ctx, cl, rec, now, pvs.Items)
}

// FromVolumes is Read for the PersistentVolumes pvs, listed by the caller: it reads nothing more
// when none of them is a kept copy.
func FromVolumes(ctx context.Context, cl *kube.Clients, rec cluster.Record, now time.Time, pvs []corev1.PersistentVolume) ([]Kept, error) {
	var kept []corev1.PersistentVolume
	for _, pv := range pvs {
		// One being deleted has lost its directory already (prune deletes the directory first).
		if pv.Annotations[move.MovedToAnnotation] != "" && pv.DeletionTimestamp == nil {
			kept = append(kept, pv)
		}
	}
	if len(kept) == 0 {
		return []Kept{}, nil
	}
	s, err := read(ctx, cl, rec, now)
	if err != nil {
		return nil, err
	}
	out := []Kept{}
	for i := range kept {
		if c, ok := s.kept(ctx, &kept[i]); ok {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].What() < out[j].What() })
	return out, nil
}

// One reads the kept copy of volume again, from scratch, and judges it alone: false when it is
// gone or no longer a kept copy.
func One(ctx context.Context, cl *kube.Clients, rec cluster.Record, now time.Time, volume string) (Kept, bool, error) {
	pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Kept{}, false, nil
	}
	if err != nil {
		return Kept{}, false, fmt.Errorf("read volume %s: %w", volume, err)
	}
	copies, err := FromVolumes(ctx, cl, rec, now, []corev1.PersistentVolume{*pv})
	if err != nil || len(copies) == 0 {
		return Kept{}, false, err
	}
	return copies[0], true, nil
}

// state is what the conditions are decided from, read once.
type state struct {
	cl         *kube.Clients
	rec        cluster.Record
	now        time.Time
	services   []*service.Service
	unfinished map[string]bool
	backups    *backup.Snapshot
	backupsErr error
}

func read(ctx context.Context, cl *kube.Clients, rec cluster.Record, now time.Time) (*state, error) {
	s := &state{cl: cl, rec: rec, now: now, unfinished: map[string]bool{}}
	var err error
	if s.services, err = service.List(ctx, cl.Dynamic, cl.Kube); err != nil {
		return nil, err
	}
	progress, err := workflow.ListUnfinished(ctx, cl.Dynamic, kube.ClusterRecords())
	if err != nil {
		return nil, err
	}
	for _, p := range progress {
		s.unfinished[p.Workflow] = true
	}
	if rec.Backups != cluster.BackupsNone {
		s.backups, s.backupsErr = backup.ReadSnapshot(ctx, cl, now)
	}
	return s, nil
}

// kept describes pv when it is a kept copy.
func (s *state) kept(ctx context.Context, pv *corev1.PersistentVolume) (Kept, bool) {
	to := pv.Annotations[move.MovedToAnnotation]
	dir, node := service.LocalPath(pv)
	if to == "" || dir == "" {
		return Kept{}, false
	}
	c := Kept{Volume: pv.Name, Node: node, Path: dir, MovedTo: to, Kind: KindMoved}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		c.SizeBytes = q.Value()
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		c.Namespace, c.Claim = ref.Namespace, ref.Name
	}
	if t, err := time.Parse(time.RFC3339, pv.Annotations[move.MovedAtAnnotation]); err == nil {
		c.MovedAt = &t
	}
	c.DeleteStarted = pv.Annotations[StartedAnnotation] != ""
	svc := s.serviceOf(c.Namespace, c.Claim)
	claim, err := s.cl.Kube.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, c.Claim, metav1.GetOptions{})
	gone := apierrors.IsNotFound(err)
	switch {
	case err != nil && !gone:
		c.hold(CondMoved, fmt.Sprintf("cannot read claim %s/%s: %v", c.Namespace, c.Claim, err), nil)
		return c, true
	case svc == nil && gone:
		c.Kind = KindOrphan
		return c, true
	case svc == nil:
		c.hold(CondMoved, fmt.Sprintf("no Kipper service uses claim %s/%s any more, but the claim remains", c.Namespace, c.Claim), nil)
		return c, true
	}
	c.Service = &svc.Ref
	switch {
	case gone:
		c.hold(CondReplaced, fmt.Sprintf("service %s has no data claim %s any more: this copy may hold the only original data", svc.Ref, c.Claim), nil)
		return c, true
	case claim.Spec.VolumeName != to:
		c.hold(CondReplaced, fmt.Sprintf("service %s's claim %s names volume %s, not Longhorn volume %s the move verified: this copy may hold the only original data",
			svc.Ref, c.Claim, cli.OrNone(claim.Spec.VolumeName), to), nil)
		return c, true
	}
	if svc.Move != "" || s.unfinished[service.MoveWorkflow(svc.Ref)] {
		c.hold(CondMoved, fmt.Sprintf("its move to Longhorn is not finished: 'kip service storage longhorn %s' finishes it", svc.Flags()), nil)
	}
	s.ready(ctx, &c, svc)
	s.backedUp(&c, svc, claim)
	s.copies(ctx, &c)
	return c, true
}

func (c *Kept) hold(condition, reason string, until *time.Time) {
	c.Holds = append(c.Holds, Hold{Condition: condition, Reason: reason, Until: until})
}

// serviceOf is the service whose data claim is namespace/claim, nil when none.
func (s *state) serviceOf(namespace, claim string) *service.Service {
	for _, svc := range s.services {
		if svc.Namespace() == namespace && svc.DataClaim() == claim {
			return svc
		}
	}
	return nil
}

// ready holds c until the service's pod that mounts its claim has been Ready for ReadyFor.
func (s *state) ready(ctx context.Context, c *Kept, svc *service.Service) {
	pods, err := service.Pods(ctx, s.cl.Kube, svc)
	if err != nil {
		c.hold(CondReady, err.Error(), nil)
		return
	}
	var pod *corev1.Pod
	for i := range pods {
		if mounts(&pods[i], c.Claim) && pods[i].DeletionTimestamp == nil {
			pod = &pods[i]
		}
	}
	if pod == nil {
		c.hold(CondReady, fmt.Sprintf("no pod of service %s runs on Longhorn volume %s (a stopped service keeps its copy)", svc.Ref, c.MovedTo), nil)
		return
	}
	since, ok := ReadySince(pod)
	if !ok {
		c.hold(CondReady, fmt.Sprintf("pod %s is not Ready", pod.Name), nil)
		return
	}
	if d := s.now.Sub(since); d < ReadyFor {
		until := since.Add(ReadyFor)
		c.hold(CondReady, fmt.Sprintf("pod %s has been Ready for %s of %s", pod.Name, minutes(d), minutes(ReadyFor)), &until)
	}
}

// ReadySince is when pod last became Ready: the later of its Ready condition's last transition
// and the start of each container's current run, so that a container that crashed and was
// restarted starts the hour again even when the pod's Ready condition never showed the gap.
func ReadySince(pod *corev1.Pod) (time.Time, bool) {
	var since time.Time
	ready := false
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			ready, since = true, cond.LastTransitionTime.Time
		}
	}
	if !ready {
		return time.Time{}, false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if !cs.Ready || cs.State.Running == nil {
			return time.Time{}, false
		}
		if t := cs.State.Running.StartedAt.Time; t.After(since) {
			since = t
		}
	}
	return since, true
}

func mounts(pod *corev1.Pod, claim string) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool {
		return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim
	})
}

// backedUp holds c until a completed backup made after the move holds the service's data from
// Longhorn (the claim bound to it now, by UID), or Grace has passed since the move. A service
// with consistent backups (a dump volume) always waits the day: Velero records hook results for
// the whole backup, so a backup does not show that this service's own dump succeeded.
func (s *state) backedUp(c *Kept, svc *service.Service, claim *corev1.PersistentVolumeClaim) {
	if c.MovedAt == nil {
		c.hold(CondBackup, fmt.Sprintf("volume %s does not record when the move committed (%s)", c.Volume, move.MovedAtAnnotation), nil)
		return
	}
	until := c.MovedAt.Add(Grace)
	if !s.now.Before(until) {
		return
	}
	day := "until " + until.Local().Format("2006-01-02 15:04")
	switch {
	case s.rec.Backups == cluster.BackupsNone:
		c.hold(CondBackup, "this cluster has no backups: waiting a day after the move, "+day, &until)
		return
	case svc.DumpClaim() != "":
		c.hold(CondBackup, fmt.Sprintf("a %s service with consistent backups waits a day after the move (a backup does not show that its own dump succeeded), %s", svc.Type, day), &until)
		return
	case s.backupsErr != nil:
		c.hold(CondBackup, fmt.Sprintf("cannot read the backups (%v): waiting a day after the move, %s", s.backupsErr, day), &until)
		return
	}
	need := backup.Claim{Namespace: c.Namespace, Name: c.Claim, UID: string(claim.UID)}
	for i := range s.backups.Backups {
		b := &s.backups.Backups[i]
		if backup.Started(b).After(*c.MovedAt) && s.backups.Holds(b, need).State == backup.StateCompleted {
			return
		}
	}
	c.hold(CondBackup, "waiting for a completed backup made after the move ('kip backup create'), or "+day, &until)
}

// copies holds c while Longhorn changes the number of copies of the volume it moved to: until
// as many replicas as the volume asks for are healthy and no other is left.
func (s *state) copies(ctx context.Context, c *Kept) {
	api := s.cl.Longhorn.LonghornV1beta2()
	v, err := api.Volumes(longhorn.Namespace).Get(ctx, c.MovedTo, metav1.GetOptions{})
	if err != nil {
		c.hold(CondCopies, fmt.Sprintf("cannot read Longhorn volume %s: %v", c.MovedTo, err), nil)
		return
	}
	reps, err := api.Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornvolume=" + c.MovedTo})
	if err != nil {
		c.hold(CondCopies, fmt.Sprintf("cannot list the replicas of Longhorn volume %s: %v", c.MovedTo, err), nil)
		return
	}
	healthy := 0
	for _, r := range reps.Items {
		if longhorn.CurrentReplica(&r) {
			healthy++
		}
	}
	if want := v.Spec.NumberOfReplicas; healthy != want || len(reps.Items) != want {
		c.hold(CondCopies, fmt.Sprintf("Longhorn is changing the copies of volume %s: %d of %d healthy, %d in all", c.MovedTo, healthy, want, len(reps.Items)), nil)
	}
}

// removable checks that a copy's directory is one the local-path provisioner made for its
// volume, directly under its storage directory: kip deletes nothing else.
func removable(c Kept) error {
	if path.Clean(c.Path) != c.Path || path.Dir(c.Path) != cluster.LocalStorageDir || !strings.HasPrefix(path.Base(c.Path), c.Volume+"_") {
		return fmt.Errorf("volume %s names directory %s, which is not the local-path directory of that volume (%s/%s_...): kip deletes only those; delete it by hand if it should go",
			c.Volume, c.Path, cluster.LocalStorageDir, c.Volume)
	}
	return nil
}

func minutes(d time.Duration) string {
	if d >= time.Hour && d%time.Hour == 0 {
		return fmt.Sprintf("%d h", d/time.Hour)
	}
	return fmt.Sprintf("%d min", int(d/time.Minute))
}
