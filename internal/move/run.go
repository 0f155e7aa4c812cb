package move

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/capacity"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/moverpod"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
)

func (o *Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Run is kip service storage longhorn NAME: a new move after its checks and the operator's
// consent, or the unfinished one continued from its step; with Rollback, the move undone.
func Run(ctx context.Context, o *Options) error {
	cl, err := o.Kube()
	if err != nil {
		return err
	}
	rec, err := cluster.ReadInstalled(ctx, cl.Dynamic)
	if err != nil {
		return err
	}
	if o.Ref, err = service.Find(ctx, cl.Dynamic, o.Ref); err != nil {
		return err
	}
	r := workflow.OnCluster(cl, o.Holder, o.KipVersion, o.Printer)
	// What the move does, it decides under the cluster lock: another kip cannot start the same
	// move, or roll it back, from what it read before this one recorded its intent.
	lock, release, err := r.TakeLock(ctx)
	if err != nil {
		return err
	}
	defer release()
	r.Held = lock
	in, resumed, err := recorded(ctx, cl, o.Ref)
	if err != nil {
		return err
	}
	if o.Rollback {
		return rollback(ctx, o, cl, r, in)
	}
	if rec.Storage != "longhorn" {
		return fmt.Errorf("this cluster keeps its volumes on local storage: switch it to Longhorn first with 'kip cluster storage longhorn'")
	}
	m := &mv{o: o, cl: cl, rec: rec, report: o.Printer}
	if !resumed {
		// A move that committed and lost its record goes on from its volumes.
		if in, err = lostCommit(ctx, cl, o.Ref); err != nil {
			return err
		}
		if resumed = in != nil; resumed {
			o.Printer.Warn("kip has no record of this move, which committed: finishing it from the volumes that remain")
		}
	}
	if resumed {
		m.in = in
	} else if m.in, err = m.prepare(ctx, rec); err != nil || m.in == nil {
		return err
	}
	if err := r.Run(ctx, &workflow.Workflow{Name: service.MoveWorkflow(o.Ref), Intent: m.in, Steps: m.steps()}); err != nil {
		return err
	}
	o.Printer.Success(fmt.Sprintf("Service %s now keeps its data on Longhorn volume %s. Its local copy stays on %s (volume %s) until 'kip cluster storage prune' deletes it",
		o.Ref, m.in.NewVolume, m.in.Node, m.in.OldVolume))
	return nil
}

// recorded reads the intent of an unfinished move of ref.
func recorded(ctx context.Context, cl *kube.Clients, ref service.Ref) (*Intent, bool, error) {
	in := &Intent{}
	p, err := workflow.Unfinished(ctx, cl.Dynamic, kube.ClusterRecords(), service.MoveWorkflow(ref), in)
	if err != nil || p == nil || len(p.Intent) == 0 {
		return nil, false, err
	}
	return in, true, nil
}

// prepare checks a new move and asks the operator; nil without error means they said no.
func (m *mv) prepare(ctx context.Context, rec cluster.Record) (*Intent, error) {
	o, cl := m.o, m.cl
	svc, err := service.Get(ctx, cl.Dynamic, o.Ref)
	if err != nil {
		return nil, err
	}
	m.svc = svc
	if svc.Move != "" {
		return nil, fmt.Errorf("service %s is marked as moving to %s but kip has no record of that move (it was lost): undo it with 'kip service storage longhorn %s --rollback', then move again",
			o.Ref, svc.Move, o.Flags())
	}
	if err := m.checkDeletion(ctx); err != nil {
		return nil, err
	}
	claim, err := cl.Kube.CoreV1().PersistentVolumeClaims(o.Namespace()).Get(ctx, svc.DataClaim(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the data claim of service %s: %w", o.Ref, err)
	}
	if claim.Status.Phase != corev1.ClaimBound {
		return nil, fmt.Errorf("the data claim %s/%s of service %s is %s, not bound to a volume: nothing to move", o.Namespace(), claim.Name, o.Ref, claim.Status.Phase)
	}
	pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read volume %s: %w", claim.Spec.VolumeName, err)
	}
	if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == "driver.longhorn.io" {
		m.o.Printer.StepAlready(fmt.Sprintf("Service %s already keeps its data on Longhorn (volume %s)", o.Ref, pv.Name))
		return nil, nil
	}
	node := service.NodeOf(pv)
	if pv.Spec.Local == nil && pv.Spec.HostPath == nil || node == "" {
		return nil, fmt.Errorf("the data of service %s is on volume %s, which is not a local volume on one node (%s): kip moves only local volumes", o.Ref, pv.Name, service.Where(pv))
	}
	// A new move asks before it stops the service: off a terminal it needs --yes, refused here
	// before the count starts a pod. A resumed move and a rollback ask nothing.
	if err := o.Prompter.CanConfirm(); err != nil {
		return nil, err
	}
	in := &Intent{Namespace: o.Namespace(), Service: o.Name, OldClaim: claim.Name, OldClaimUID: claim.UID, OldVolume: pv.Name,
		NewClaim: newClaimName(o.Name), Node: node, WasStopped: svc.Stopped, Dump: svc.DumpClaim()}
	m.in = in
	if err := m.checkBackups(ctx, rec); err != nil {
		return nil, err
	}
	totals, err := m.scan(ctx)
	if err != nil {
		return nil, err
	}
	in.Data = totals
	declared := int64(0)
	if svc.Storage != "" {
		if q, err := resource.ParseQuantity(svc.Storage); err == nil {
			declared = q.Value()
		}
	}
	in.Size = plannedSize(totals.Bytes, declared)
	if err := m.checkRoom(ctx); err != nil {
		return nil, err
	}
	if err := m.checkQuota(ctx, in.Size); err != nil {
		return nil, err
	}
	if err := longhorn.Room(ctx, cl, node, in.Size); err != nil {
		return nil, err
	}
	down := downtime(totals)
	m.o.Printer.Info(fmt.Sprintf("Service %s holds %s in %d files and %d directories on %s (volume %s).",
		o.Ref, cli.FormatBytes(totals.Bytes), totals.Files, totals.Directories, node, pv.Name))
	m.o.Printer.Info(fmt.Sprintf("The move copies it into a new single-copy Longhorn volume of %s, verifies the copy and starts the service on it. "+
		"The service is stopped for about %s (10 MiB/s for copying and verifying, 3 ms per file and directory, 3 minutes to stop, detach and start); apps that use it see it unavailable the whole time.",
		gibText(in.Size), cli.FormatDuration(down.Round(time.Second))))
	ok, err := m.o.Prompter.Confirm(fmt.Sprintf("Stop service %s and move its data to Longhorn?", o.Ref))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("cancelled: nothing was changed")
	}
	return in, nil
}

// checkDeletion refuses a move into a namespace or project that is being deleted.
func (m *mv) checkDeletion(ctx context.Context) error {
	ns, err := m.cl.Kube.CoreV1().Namespaces().Get(ctx, m.o.Namespace(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", m.o.Namespace(), err)
	}
	if ns.DeletionTimestamp != nil {
		return fmt.Errorf("namespace %s is being deleted: its services cannot move", ns.Name)
	}
	p, err := service.Project(ctx, m.cl.Dynamic, m.o.Project)
	if err != nil {
		return err
	}
	if p.GetDeletionTimestamp() != nil {
		return fmt.Errorf("project %s is being deleted: its services cannot move", m.o.Project)
	}
	return nil
}

// checkBackups requires a completed backup of the project on a cluster with backups, and
// --no-backup on one without.
func (m *mv) checkBackups(ctx context.Context, rec cluster.Record) error {
	if rec.Backups == cluster.BackupsNone {
		if !m.o.NoBackup {
			return fmt.Errorf("this cluster has no backups, so nothing could restore service %s if the move went wrong: pass --no-backup to move anyway", m.o.Ref)
		}
		return nil
	}
	namespaces, err := backup.ProjectNamespaces(ctx, m.cl, m.o.Project)
	if err != nil {
		return err
	}
	if !slices.Contains(namespaces, m.in.Namespace) {
		// console-api has not listed the environment yet: its namespace is still the project's.
		namespaces = append(namespaces, m.in.Namespace)
	}
	snap, err := backup.ReadSnapshot(ctx, m.cl, m.o.now())
	if err != nil {
		return err
	}
	// What the move needs is a backup of this service's data: its data and dump volumes, which
	// its running pod mounts. Another service of the project, stopped while a backup ran, left
	// nothing of its volumes in it and does not count against it.
	need := []backup.Claim{{Namespace: m.in.Namespace, Name: m.in.OldClaim}}
	if m.in.Dump != "" {
		need = append(need, backup.Claim{Namespace: m.in.Namespace, Name: m.in.Dump})
	}
	b, err := snap.LatestHolding(namespaces, need...)
	if err != nil {
		return fmt.Errorf("a move needs a completed backup of project %s: %w; back it up with 'kip backup create --project %s --wait'", m.o.Project, err, m.o.Project)
	}
	m.o.Printer.Info("Latest completed backup of project " + m.o.Project + ": " + b.Name)
	return nil
}

// scan runs the scan pod on the local volume and returns what it holds.
func (m *mv) scan(ctx context.Context) (mover.Totals, error) {
	name := scanPodName(m.in.Service)
	if err := m.deletePod(ctx, name); err != nil {
		return mover.Totals{}, err
	}
	if err := m.deliver(ctx); err != nil {
		return mover.Totals{}, err
	}
	pod, err := moverpod.Pod(moverpod.Spec{Name: name, Namespace: m.in.Namespace, Op: mover.OpScan, Node: m.in.Node,
		Original: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: m.in.OldClaim, ReadOnly: true}},
		Labels:   map[string]string{MoveLabel: m.in.Service}})
	if err != nil {
		return mover.Totals{}, err
	}
	m.o.Printer.StepStarted("Count the data of " + m.in.Service)
	start := time.Now()
	pods := m.cl.Kube.CoreV1().Pods(m.in.Namespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{FieldManager: kube.FieldManager}); err != nil {
		return mover.Totals{}, fmt.Errorf("create pod %s/%s: %w", m.in.Namespace, name, err)
	}
	defer func() { _ = m.deletePod(context.WithoutCancel(ctx), name) }()
	var rep *mover.Report
	err = kube.PollPending(ctx, podTimeout, "pod "+m.in.Namespace+"/"+name, func(ctx context.Context) (string, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if rep, err = moverpod.Result(ctx, m.cl.Kube, p); err != nil || rep != nil {
			return "", err
		}
		return podState(p), nil
	})
	if err != nil {
		return mover.Totals{}, err
	}
	if rep.Result != mover.Done {
		return mover.Totals{}, fmt.Errorf("counting the data of %s failed: %s", m.in.Service, reportText(rep))
	}
	m.o.Printer.StepDone("Counted the data of "+m.in.Service, time.Since(start))
	return rep.Totals, nil
}

// podsOn lists every pod and the node named.
func (m *mv) podsOn(ctx context.Context) (*corev1.Node, []corev1.Pod, error) {
	node, err := m.cl.Kube.CoreV1().Nodes().Get(ctx, m.in.Node, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("read node %s: %w", m.in.Node, err)
	}
	pods, err := m.cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list pods: %w", err)
	}
	return node, pods.Items, nil
}

// checkRoom refuses a move when the node would not keep room for the largest of the copy pod,
// the verify pod and the service once the service's pods are gone.
func (m *mv) checkRoom(ctx context.Context) error {
	node, pods, err := m.podsOn(ctx)
	if err != nil {
		return err
	}
	gone, err := service.Pods(ctx, m.cl.Kube, m.svc)
	if err != nil {
		return err
	}
	svcNeeds := corev1.ResourceList{}
	for i := range gone {
		for n, q := range capacity.PodUsage(&gone[i]) {
			sum := svcNeeds[n]
			sum.Add(q)
			svcNeeds[n] = sum
		}
	}
	return capacity.CheckRoom(node, pods, gone,
		capacity.Need{What: "the copy pod", Requests: moverpod.Resources(mover.OpCopy).Requests},
		capacity.Need{What: "the verify pod", Requests: moverpod.Resources(mover.OpVerify).Requests},
		capacity.Need{What: "the service", Requests: svcNeeds})
}

// checkQuota refuses a move the namespace's quotas would stop: the copy pod (as the LimitRanges
// leave it) once the service's pods are gone, and the new claims (the volume at size, and the
// dump volume of a service that has one).
func (m *mv) checkQuota(ctx context.Context, size int64) error {
	ns := m.in.Namespace
	quotas, err := m.cl.Kube.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the quotas of %s: %w", ns, err)
	}
	if len(quotas.Items) == 0 {
		return nil
	}
	ranges, err := m.cl.Kube.CoreV1().LimitRanges(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the limit ranges of %s: %w", ns, err)
	}
	pod, err := moverpod.Pod(moverpod.Spec{Name: copyPodName(m.in.Service), Namespace: ns, Op: mover.OpCopy, Node: m.in.Node})
	if err != nil {
		return err
	}
	if pod, err = capacity.ApplyLimitRanges(ranges.Items, pod); err != nil {
		return err
	}
	svc := m.svc
	if svc == nil {
		if svc, err = service.Get(ctx, m.cl.Dynamic, m.o.Ref); err != nil {
			return err
		}
	}
	gone, err := service.Pods(ctx, m.cl.Kube, svc)
	if err != nil {
		return err
	}
	if err := capacity.CheckQuotas(quotas.Items, pod, gone); err != nil {
		return err
	}
	claims := []int64{size}
	if m.in.Dump != "" {
		claims = append(claims, size)
	}
	return capacity.CheckClaimQuotas(quotas.Items, Class, claims...)
}

// checkGrowRoom checks Longhorn's room and the quota again before the volume grows to size.
func (m *mv) checkGrowRoom(ctx context.Context, size int64) error {
	c, err := m.newClaim(ctx)
	if err != nil {
		return err
	}
	if err := longhorn.Room(ctx, m.cl, m.in.Node, size-provisioned(c)); err != nil {
		return fmt.Errorf("the volume cannot grow: %w; service %s stays stopped: 'kip service storage longhorn %s --rollback' returns it", err, m.in.Service, m.o.Flags())
	}
	// The volume's claim counts at its new size, the dump volume at it too.
	claims := []int64{size - provisioned(c)}
	if m.in.Dump != "" {
		claims = append(claims, size)
	}
	quotas, err := m.cl.Kube.CoreV1().ResourceQuotas(m.in.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the quotas of %s: %w", m.in.Namespace, err)
	}
	if err := capacity.CheckClaimQuotas(quotas.Items, Class, claims...); err != nil {
		return fmt.Errorf("the volume cannot grow: %w; service %s stays stopped: 'kip service storage longhorn %s --rollback' returns it", err, m.in.Service, m.o.Flags())
	}
	return nil
}

// rollback undoes an unfinished move, with r, which holds the cluster lock: the move's pods and
// claim go, the local volume keeps its policy from before the move, the fence is lifted and the
// service starts on its local volume.
// Without a record (it was lost), it works from the volumes that remain.
func rollback(ctx context.Context, o *Options, cl *kube.Clients, r *workflow.Runner, in *Intent) error {
	svc, err := service.Get(ctx, cl.Dynamic, o.Ref)
	if err != nil {
		return err
	}
	if in == nil {
		lost, err := lostCommit(ctx, cl, o.Ref)
		if err != nil {
			return err
		}
		if lost != nil {
			return fmt.Errorf("the move of %s committed (its data lives on Longhorn volume %s now) and cannot be rolled back: kip has no record of it, and 'kip service storage longhorn %s' finishes it from the volumes",
				o.Ref, lost.NewVolume, o.Flags())
		}
		if in, err = fromVolumes(ctx, cl, svc); err != nil {
			return err
		}
		if in == nil {
			// A move stopped while it counted the data, before it recorded anything, leaves
			// only its scan pod.
			m := &mv{o: o, cl: cl, in: &Intent{Namespace: o.Namespace(), Service: o.Name}, report: o.Printer}
			scan := scanPodName(o.Name)
			if _, err := cl.Kube.CoreV1().Pods(o.Namespace()).Get(ctx, scan, metav1.GetOptions{}); err == nil {
				if err := m.deletePod(ctx, scan); err != nil {
					return err
				}
				o.Printer.Info("Deleted the scan pod " + scan + " of a move stopped before it changed anything")
			} else if !apierrors.IsNotFound(err) {
				return fmt.Errorf("read pod %s/%s: %w", o.Namespace(), scan, err)
			}
			o.Printer.StepAlready("Service " + o.Ref.String() + " has no unfinished move to roll back")
			return nil
		}
		o.Printer.Warn("kip has no record of this move: rolling back from the volumes that remain")
	}
	m := &mv{o: o, cl: cl, in: in, svc: svc, report: o.Printer}
	pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the local volume %s: %w", in.OldVolume, err)
	}
	if to := pv.Annotations[MovedToAnnotation]; to != "" {
		return fmt.Errorf("the move of %s committed (its data lives on Longhorn volume %s now) and cannot be rolled back: finish it with 'kip service storage longhorn %s'", o.Ref, to, o.Flags())
	}
	steps := []workflow.Step{
		{Name: "pods", Title: "Delete the move's pods", Done: "Deleted the move's pods", Already: "No move pod left",
			Check: m.detachedPods, Apply: func(ctx context.Context) error {
				for _, n := range []string{copyPodName(in.Service), verifyPod(in.Service), scanPodName(in.Service)} {
					if err := m.deletePod(ctx, n); err != nil {
						return err
					}
				}
				return nil
			}},
		{Name: "volume", Title: "Delete the move's Longhorn volume", Done: "Deleted the move's Longhorn volume", Already: "No Longhorn volume of the move left",
			Check: m.newGone, Apply: m.deleteNew},
		{Name: "reclaim", Title: "Give the local volume back its reclaim policy", Done: "Local volume " + in.OldVolume + " has its reclaim policy from before the move",
			Already: "Local volume " + in.OldVolume + " has its reclaim policy from before the move", Check: m.policyRestored, Apply: m.restorePolicy},
		{Name: "start", Title: "Start service " + in.Service + " on its local volume", Done: "Service " + in.Service + " runs on its local volume again",
			Already: "Service " + in.Service + " back on its local volume", Check: m.started, Apply: m.start},
	}
	if err := r.Run(ctx, &workflow.Workflow{Name: service.MoveWorkflow(o.Ref) + "-rollback", Intent: in, Steps: steps}); err != nil {
		return err
	}
	// The move is over: its record goes, so a new move starts afresh.
	if err := workflow.Forget(ctx, cl.Dynamic, kube.ClusterRecords(), service.MoveWorkflow(o.Ref)); err != nil {
		return err
	}
	o.Printer.Success("Rolled back the move of " + o.Ref.String() + ": it keeps its data on its local volume " + in.OldVolume)
	return nil
}

// lostCommit rebuilds the intent of an unfinished move of ref that committed and lost its
// record, from the local volume the commit marked (MovedToAnnotation, its claimRef naming the
// service's data claim): nil when no such volume is left, or when nothing says a move of the
// service is unfinished (the move annotation, the fence's namespace label), as after a move
// that finished, whose local copy stays until a prune.
func lostCommit(ctx context.Context, cl *kube.Clients, ref service.Ref) (*Intent, error) {
	svc, err := service.Get(ctx, cl.Dynamic, ref)
	if err != nil {
		return nil, err
	}
	ns, err := cl.Kube.CoreV1().Namespaces().Get(ctx, svc.Namespace(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read namespace %s: %w", svc.Namespace(), err)
	}
	if _, fenced := ns.Labels[moveguard.NamespaceLabel(svc.Name)]; svc.Move == "" && !fenced {
		return nil, nil
	}
	pvs, err := cl.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var old *corev1.PersistentVolume
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		ref := pv.Spec.ClaimRef
		if pv.Annotations[MovedToAnnotation] == "" || ref == nil || ref.Namespace != svc.Namespace() || ref.Name != svc.DataClaim() {
			continue
		}
		// A copy kept from an earlier move of the same claim is older.
		if old == nil || pv.Annotations[MovedAtAnnotation] > old.Annotations[MovedAtAnnotation] {
			old = pv
		}
	}
	if old == nil {
		return nil, nil
	}
	return &Intent{Namespace: svc.Namespace(), Service: svc.Name, OldClaim: svc.DataClaim(), OldClaimUID: old.Spec.ClaimRef.UID,
		OldVolume: old.Name, NewClaim: newClaimName(svc.Name), NewVolume: old.Annotations[MovedToAnnotation], Node: service.NodeOf(old),
		WasStopped: old.Annotations[WasStoppedAnnotation] == "true", Dump: svc.DumpClaim()}, nil
}

// fromVolumes rebuilds a lost move's intent from the service's claim, its volume and the move's
// claim; nil when nothing says a move was started. Whether the service was stopped before the
// move, the fence says.
func fromVolumes(ctx context.Context, cl *kube.Clients, svc *service.Service) (*Intent, error) {
	claims := cl.Kube.CoreV1().PersistentVolumeClaims(svc.Namespace())
	old, err := claims.Get(ctx, svc.DataClaim(), metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the data claim of service %s: %w", svc.Ref, err)
	}
	in := &Intent{Namespace: svc.Namespace(), Service: svc.Name, OldClaim: old.Name, OldClaimUID: old.UID, OldVolume: old.Spec.VolumeName,
		NewClaim: newClaimName(svc.Name), Dump: svc.DumpClaim()}
	if n, err := claims.Get(ctx, in.NewClaim, metav1.GetOptions{}); err == nil {
		in.NewVolume = n.Spec.VolumeName
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	fenced := false
	if ns, err := cl.Kube.CoreV1().Namespaces().Get(ctx, svc.Namespace(), metav1.GetOptions{}); err == nil {
		_, fenced = ns.Labels[moveguard.NamespaceLabel(svc.Name)]
	}
	// The fence's ConfigMap is the move's first write after its record: a move killed right
	// after it left nothing else.
	stopped, fencePut, err := moveguard.ReadWasStopped(ctx, cl.Kube, svc.Namespace(), svc.Name)
	if err != nil {
		return nil, err
	}
	if svc.Move == "" && in.NewVolume == "" && !fenced && !fencePut {
		return nil, nil
	}
	in.WasStopped = stopped
	return in, nil
}

func (m *mv) detachedPods(ctx context.Context) (bool, error) {
	for _, n := range []string{copyPodName(m.in.Service), verifyPod(m.in.Service), scanPodName(m.in.Service)} {
		if _, err := m.cl.Kube.CoreV1().Pods(m.in.Namespace).Get(ctx, n, metav1.GetOptions{}); err == nil {
			return false, nil
		} else if !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	return true, nil
}

func (m *mv) newGone(ctx context.Context) (bool, error) {
	c, err := m.newClaim(ctx)
	if err != nil || c != nil {
		return false, err
	}
	if m.in.NewVolume == "" {
		return true, nil
	}
	_, err = m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.NewVolume, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

func (m *mv) deleteNew(ctx context.Context) error {
	claims := m.cl.Kube.CoreV1().PersistentVolumeClaims(m.in.Namespace)
	if err := deleteClaim(ctx, claims, m.in.NewClaim, ""); err != nil {
		return err
	}
	if m.in.NewVolume == "" {
		return nil
	}
	pvs := m.cl.Kube.CoreV1().PersistentVolumes()
	// The class deletes a released volume; one kip set to Retain is deleted here.
	err := kube.PollPending(ctx, detachTimeout, "volume "+m.in.NewVolume+" to be deleted", func(ctx context.Context) (string, error) {
		pv, err := pvs.Get(ctx, m.in.NewVolume, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return "", nil
		case err != nil:
			return "", err
		case pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain && pv.DeletionTimestamp == nil:
			if err := pvs.Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		return "it is " + strings.ToLower(string(pv.Status.Phase)), nil
	})
	return err
}

func (m *mv) policyRestored(ctx context.Context) (bool, error) {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read the local volume %s: %w", m.in.OldVolume, err)
	}
	return pv.Annotations[ReclaimAnnotation] == "", nil
}

func (m *mv) restorePolicy(ctx context.Context) error {
	pv, err := m.cl.Kube.CoreV1().PersistentVolumes().Get(ctx, m.in.OldVolume, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the local volume %s: %w", m.in.OldVolume, err)
	}
	if pv.Annotations[ReclaimAnnotation] == "" {
		return nil
	}
	return m.patchPV(ctx, m.in.OldVolume, map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{ReclaimAnnotation: nil}},
		"spec":     map[string]any{"persistentVolumeReclaimPolicy": pv.Annotations[ReclaimAnnotation]}})
}
