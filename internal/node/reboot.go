package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"

	"kipper.run/kip/internal/backup"
	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// Timeouts of a reboot's waits.
const (
	rebootTimeout    = 15 * time.Minute // the host booting again and its node Ready on the new boot
	workloadsTimeout = 10 * time.Minute // the workloads that were Ready on the worker Ready again
)

// bootIDCommand prints the host's boot ID, which the kubelet also reports as its node's.
const bootIDCommand = "cat /proc/sys/kernel/random/boot_id"

// RebootOptions is what kip node reboot was asked to do, and what it takes from the command
// around it.
type RebootOptions struct {
	Worker string // WORKER: the node's name
	// NoBackup reboots without taking a backup first; a cluster without backups needs it.
	NoBackup bool
	DryRun   bool

	Env
}

// rebootIntent is what a reboot decided, kept in its progress record so that a resumed reboot
// waits for the same things: the host's boot before the reboot, the backup it took and the
// workloads that were Ready on the worker.
type rebootIntent struct {
	Node      string     `json:"node"`
	BootID    string     `json:"bootID"`
	Backup    string     `json:"backup,omitempty"`
	Workloads []workload `json:"workloads,omitempty"`
}

// workload is a Deployment, StatefulSet or DaemonSet that ran a Ready pod on the worker.
type workload struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (w workload) String() string { return w.Kind + " " + w.Namespace + "/" + w.Name }

// rebooter is one run of kip node reboot.
type rebooter struct {
	o      *RebootOptions
	p      *cli.Printer
	cl     *kube.Clients
	worker cluster.Worker
	node   *sshx.Client
	// namespaces are the Kipper namespaces the backup holds; none when there is no backup to take.
	namespaces []string
	// moves are the Longhorn volumes whose only current copy is on the worker: the copies step
	// moves each off it before the drain.
	moves  []string
	intent rebootIntent
}

func rebootWorkflow(name string) string { return "node-reboot-" + name }

// Reboot reboots a worker: a backup first, then a drain, the reboot, and a wait until the
// workloads that were Ready on it are Ready again.
func Reboot(ctx context.Context, o *RebootOptions) error {
	r := &rebooter{o: o, p: o.Printer, intent: rebootIntent{Node: o.Worker}}
	defer func() {
		if r.node != nil {
			r.node.Close()
		}
	}()
	err := o.runWorkerCommand(ctx, workerCommand{
		verb: "reboot", worker: o.Worker, dryRun: o.DryRun,
		examine: func(ctx context.Context) (*kube.Clients, error) {
			err := r.examine(ctx)
			return r.cl, err
		},
		question: func(context.Context) string {
			first := ""
			if len(r.moves) > 0 {
				first = " first has Longhorn move the only current copy of volume " + strings.Join(r.moves, ", ") + " to the server (it has room),"
			}
			return fmt.Sprintf("Reboot worker %s (%s)? kip%s drains it, so its pods start on other nodes, reboots it and waits for its workloads to be Ready again.",
				o.Worker, r.worker.Host, first)
		},
		workflow: func() *workflow.Workflow {
			return &workflow.Workflow{Name: rebootWorkflow(o.Worker), Intent: &r.intent, Steps: r.steps()}
		},
	})
	if err == nil && !o.DryRun {
		r.p.Success(fmt.Sprintf("Rebooted worker %s: it is Ready again, and so are the workloads that ran there (%s)",
			o.Worker, cli.Count(len(r.intent.Workloads), "workload", "workloads")))
	}
	return err
}

// examine reads the cluster and reaches the worker, refusing what kip node reboot refuses
// before anything changes.
func (r *rebooter) examine(ctx context.Context) error {
	name := r.o.Worker
	t, err := readWorker(ctx, r.o.Kube, name, "kip node reboot reboots workers")
	r.cl = t.cl
	rec, w, n := t.rec, t.worker, t.node
	switch {
	case err != nil:
		return err
	case w.State == cluster.WorkerJoining:
		return fmt.Errorf("worker %s has not finished joining: run kip node add %s again to finish it, then reboot it", name, w.Host)
	case w.State == cluster.WorkerRemoving:
		return fmt.Errorf("worker %s is being removed: run kip node remove %s again to finish it", name, name)
	case n == nil:
		return fmt.Errorf("worker %s has no node in the cluster: rejoin it with kip node add %s", name, w.Host)
	}
	r.worker = w
	status := cluster.NodeStatus(n)
	if w.Fence != nil || status == cluster.NodeOutOfService {
		return fmt.Errorf("worker %s is fenced (out of service), and a reboot would start its k3s again while other nodes may run its services: "+
			"bring it back with kip node add %s", name, w.Host)
	}
	resumed, err := r.resumed(ctx)
	if err != nil {
		return err
	}
	if status != cluster.NodeReady && !resumed {
		return fmt.Errorf("worker %s is %s, and a reboot drains it and waits for its workloads, which needs it Ready: "+
			"rejoin it with kip node add %s (a worker whose certificates expired shows NotReady)", name, status, w.Host)
	}
	if err := r.checkCopies(ctx); err != nil {
		return err
	}
	if err := checkPods(ctx, r.cl, name); err != nil {
		return err
	}
	if err := r.backupScope(ctx, rec); err != nil {
		return err
	}
	if r.node, err = r.o.Dial(ctx, w.Host); err != nil {
		return fmt.Errorf("a reboot runs over SSH, and kip cannot reach %s at %s: %w; fix SSH to it, then run the same command again", name, w.Host, err)
	}
	id, err := readIdentity(ctx, r.node)
	if err != nil {
		return err
	}
	if err := checkIdentity(id, name, w, n); err != nil {
		return err
	}
	if resumed {
		return nil // the runner loads the boot and the workloads the progress record holds
	}
	r.intent.BootID = id.BootID
	r.intent.Workloads, err = readyWorkloads(ctx, r.cl, name)
	return err
}

// resumed reports whether an unfinished reboot of the worker is recorded.
func (r *rebooter) resumed(ctx context.Context) (bool, error) {
	p, err := workflow.Unfinished(ctx, r.cl.Dynamic, kube.ClusterRecords(), rebootWorkflow(r.o.Worker), nil)
	return p != nil, err
}

// checkCopies decides what the reboot does about the volumes whose every current copy (a
// Longhorn replica healthy since it last failed) is on the worker, which a reboot would leave
// unavailable until the worker is back: each is moved to the server first (the copies step) when
// the server's Longhorn disks have room for them all, and the reboot is refused otherwise, or
// when the worker's copy is not current either.
func (r *rebooter) checkCopies(ctx context.Context) error {
	lh := r.cl.Longhorn.LonghornV1beta2()
	replicas, err := lh.Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Longhorn's replicas: %w", err)
	}
	only := longhorn.OnlyReplicasOn(replicas.Items, r.o.Worker)
	if len(only) == 0 {
		return nil
	}
	var stale []string
	for _, v := range only {
		if !slices.ContainsFunc(replicas.Items, func(rep longhornv1beta2.Replica) bool {
			return rep.Spec.VolumeName == v && rep.Spec.NodeID == r.o.Worker && longhorn.CurrentReplica(&rep)
		}) {
			stale = append(stale, v)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("no node holds a current copy of Longhorn volume %s, not even %s, so kip cannot move one to the server before the reboot: "+
			"'kubectl -n %s get replicas.longhorn.io -l longhornvolume=<volume>' shows its copies; once Longhorn reports one healthy, run the same command again",
			strings.Join(stale, ", "), r.o.Worker, longhorn.Namespace)
	}
	server, err := cluster.ServerNode(ctx, r.cl.Kube)
	if err != nil {
		return err
	}
	var size int64
	for _, v := range only {
		if slices.ContainsFunc(replicas.Items, func(rep longhornv1beta2.Replica) bool {
			return rep.Spec.VolumeName == v && rep.Spec.NodeID == r.o.Worker && rep.Spec.EvictionRequested
		}) {
			continue // an interrupted reboot asked for its move: Longhorn already counts the new copy against the server's room
		}
		vol, err := lh.Volumes(longhorn.Namespace).Get(ctx, v, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read Longhorn volume %s: %w", v, err)
		}
		size += vol.Spec.Size
	}
	if size > 0 {
		if err := longhorn.Room(ctx, r.cl, server.Name, size); err != nil {
			return fmt.Errorf("no node but %s holds a current copy of Longhorn volume %s, so a reboot would leave its data unavailable until %s is back, "+
				"and the server has no room to take the copies (%.1f GiB): %w; then run the same command again", r.o.Worker, strings.Join(only, ", "), r.o.Worker, float64(size)/(1<<30), err)
		}
	}
	r.moves = only
	return nil
}

// rebootPinnedAnnotation is what a reboot's copies step puts on each volume it restricts to the
// server's tag (longhorn.ServerTag) until its copy is there, with the worker's name as its value.
const rebootPinnedAnnotation = "kipper.run/reboot-pinned"

// copiesStep moves the only current copy of each volume in r.moves off the worker, to the server.
// kip tags the server's Longhorn node and sets each volume's node selector to that tag (a volume
// whose selector the operator set keeps it, and Longhorn picks among the nodes it allows), then
// cordons the worker, and Longhorn does the rest: under the node-drain-policy kip pins
// (block-for-eviction-if-contains-last-replica) its node controller asks to evict each replica on
// a cordoned node that is its volume's last healthy one (and cancels an eviction asked of a
// single replica on a node that is not cordoned), and its volume controller rebuilds the copy on
// a node whose tags hold the volume's selector (attaching a detached volume for that), then
// deletes the worker's (longhorn-manager v1.10.0: controller/node_controller.go
// shouldEvictReplica, controller/volume_controller.go EvictReplicas, scheduler/
// replica_scheduler.go). kip waits until another node holds a current copy of each; the unpin
// step then gives the volumes their empty selector back.
func (r *rebooter) copiesStep() workflow.Step {
	name := r.o.Worker
	vols := strings.Join(r.moves, ", ")
	left := func(ctx context.Context) ([]string, error) {
		replicas, err := r.cl.Longhorn.LonghornV1beta2().Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Longhorn's replicas: %w", err)
		}
		only := longhorn.OnlyReplicasOn(replicas.Items, name)
		return slices.DeleteFunc(only, func(v string) bool { return !slices.Contains(r.moves, v) }), nil
	}
	return workflow.Step{
		Name: "copies", Title: "Move the only current copy of Longhorn volume " + vols + " off " + name + " to the server",
		Done: "Another node holds a current copy of " + vols, Already: "Another node holds a current copy of " + vols,
		Check: func(ctx context.Context) (bool, error) {
			l, err := left(ctx)
			return err == nil && len(l) == 0, err
		},
		Plan: func(context.Context) ([]string, error) {
			return []string{"tag the server's Longhorn node " + longhorn.ServerTag + " and restrict the volumes' new copies to it",
				"cordon " + name + ": Longhorn then rebuilds on the server each copy that is its volume's last healthy one there"}, nil
		},
		Apply: func(ctx context.Context) error {
			if err := r.pinToServer(ctx); err != nil {
				return err
			}
			if err := cordon(ctx, r.cl, name, true); err != nil {
				return err
			}
			err := kube.Poll(ctx, evictTimeout, "a current copy of "+vols+" on another node", func(ctx context.Context) (bool, string, error) {
				l, err := left(ctx)
				return err == nil && len(l) == 0, "no node but " + name + " holds a current copy of " + strings.Join(l, ", ") + " yet", err
			})
			if err != nil {
				return fmt.Errorf("%w: Longhorn rebuilds each copy on the server; see 'kubectl -n %s get replicas.longhorn.io -l longhornvolume=<volume>', "+
					"and run the same command again to keep waiting", err, longhorn.Namespace)
			}
			return nil
		},
	}
}

// pinToServer tags the server's Longhorn node and restricts the new copies of each volume in
// r.moves without a node selector to that tag, marking it so that the unpin step, also of a
// resumed reboot, finds it. While Longhorn keeps volumes without a selector off tagged nodes
// (allow-empty-node-selector-volume false), kip tags nothing and Longhorn picks the node.
func (r *rebooter) pinToServer(ctx context.Context) error {
	lh := r.cl.Longhorn.LonghornV1beta2()
	st, err := lh.Settings(longhorn.Namespace).Get(ctx, longhorn.AllowEmptySelector, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("read Longhorn's setting %s: %w", longhorn.AllowEmptySelector, err)
	}
	if err == nil && st.Value == "false" {
		r.p.Warn("Longhorn's setting " + longhorn.AllowEmptySelector + " is false, so tagging the server would keep other volumes' new copies off it: Longhorn picks the node that takes each copy")
		return nil
	}
	server, err := cluster.ServerNode(ctx, r.cl.Kube)
	if err != nil {
		return err
	}
	if err := longhorn.TagServer(ctx, r.cl, server.Name); err != nil {
		return err
	}
	for _, v := range r.moves {
		vol, err := lh.Volumes(longhorn.Namespace).Get(ctx, v, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read Longhorn volume %s: %w", v, err)
		}
		if len(vol.Spec.NodeSelector) > 0 {
			continue // the operator's selector, or this reboot's already
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}},"spec":{"nodeSelector":[%q]}}`, rebootPinnedAnnotation, r.o.Worker, longhorn.ServerTag)
		if _, err := lh.Volumes(longhorn.Namespace).Patch(ctx, v, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
			return fmt.Errorf("restrict the new copies of Longhorn volume %s to the server: %w", v, err)
		}
	}
	return nil
}

// unpinStep gives each volume the copies step restricted to the server its empty node selector
// back, once its copy is there (the server's tag stays). A volume of one copy stays pinned: its
// copy belongs on the server (longhorn.PlacementStep).
func (r *rebooter) unpinStep() workflow.Step {
	name := r.o.Worker
	pinned := func(ctx context.Context) ([]longhornv1beta2.Volume, error) {
		list, err := r.cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list Longhorn's volumes: %w", err)
		}
		return slices.DeleteFunc(list.Items, func(v longhornv1beta2.Volume) bool { return v.Annotations[rebootPinnedAnnotation] != name }), nil
	}
	return workflow.Step{
		Name: "unpin", Title: "Let Longhorn place the moved copies' volumes on any node again",
		Done: "The moved copies' volumes may use any node again", Already: "No volume is restricted to the server for the reboot",
		Check: func(ctx context.Context) (bool, error) {
			p, err := pinned(ctx)
			return err == nil && len(p) == 0, err
		},
		Apply: func(ctx context.Context) error {
			p, err := pinned(ctx)
			if err != nil {
				return err
			}
			for _, v := range p {
				patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}},"spec":{"nodeSelector":[]}}`, rebootPinnedAnnotation)
				if v.Spec.NumberOfReplicas == 1 {
					patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, rebootPinnedAnnotation)
				}
				_, err := r.cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).Patch(ctx, v.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("lift the server-only restriction of Longhorn volume %s: %w", v.Name, err)
				}
			}
			return nil
		},
	}
}

// backupScope decides what the reboot backs up: every Kipper project's namespaces, unless
// --no-backup; a cluster without backups needs --no-backup.
func (r *rebooter) backupScope(ctx context.Context, rec cluster.Record) error {
	switch {
	case r.o.NoBackup:
		r.p.Info("--no-backup: kip reboots " + r.o.Worker + " without a backup first")
		return nil
	case rec.Backups == cluster.BackupsNone:
		return fmt.Errorf("this cluster has no backups, so nothing could restore what a failed reboot lost: pass --no-backup to reboot %s anyway", r.o.Worker)
	}
	var err error
	if r.namespaces, err = backup.ProjectNamespaces(ctx, r.cl, ""); err != nil {
		return err
	}
	if len(r.namespaces) == 0 {
		r.p.Info("No Kipper project has a namespace yet: there is nothing to back up")
	}
	return nil
}

// readyWorkloads are the Deployments, StatefulSets and DaemonSets with a Ready pod on node.
func readyWorkloads(ctx context.Context, cl *kube.Clients, node string) ([]workload, error) {
	pods, err := cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("list the pods on %s: %w", node, err)
	}
	var out []workload
	deployments := map[string]*metav1.OwnerReference{} // by ReplicaSet, read once each
	for i := range pods.Items {
		p := &pods.Items[i]
		if !podutils.IsPodReady(p) || p.DeletionTimestamp != nil {
			continue
		}
		owner := metav1.GetControllerOf(p)
		if owner == nil {
			continue
		}
		w := workload{Kind: owner.Kind, Namespace: p.Namespace, Name: owner.Name}
		if owner.Kind == "ReplicaSet" {
			key := p.Namespace + "/" + owner.Name
			d, read := deployments[key]
			if !read {
				rs, err := cl.Kube.AppsV1().ReplicaSets(p.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("read ReplicaSet %s of pod %s: %w", key, p.Name, err)
				}
				d = metav1.GetControllerOf(rs)
				deployments[key] = d
			}
			if d == nil || d.Kind != "Deployment" {
				continue // a bare ReplicaSet has no rollout to wait for
			}
			w = workload{Kind: d.Kind, Namespace: p.Namespace, Name: d.Name}
		}
		if (w.Kind == "Deployment" || w.Kind == "StatefulSet" || w.Kind == "DaemonSet") && !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b workload) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

// steps are the reboot's steps, in order.
func (r *rebooter) steps() []workflow.Step {
	var steps []workflow.Step
	if len(r.namespaces) > 0 {
		steps = append(steps, r.backupStep())
	}
	if len(r.moves) > 0 {
		steps = append(steps, r.copiesStep())
	}
	return append(steps, r.unpinStep(), drainStep(r.cl, r.o.Worker), r.rebootStep(), r.uncordonStep(), r.workloadsStep())
}

// backupStep backs up every Kipper project's namespaces and waits until it is a completed
// backup.
func (r *rebooter) backupStep() workflow.Step {
	return workflow.Step{
		Name: "backup", Title: "Back up the Kipper projects before the reboot",
		Done: "Backed up the Kipper projects", Already: "The Kipper projects are backed up",
		Check: func(ctx context.Context) (bool, error) {
			if r.intent.Backup == "" {
				return false, nil
			}
			snap, err := backup.ReadSnapshot(ctx, r.cl, time.Now())
			if err != nil {
				return false, err
			}
			b, err := snap.Find(r.intent.Backup)
			if err != nil {
				return false, nil // deleted meanwhile: take another
			}
			return snap.Verdict(b).State == backup.StateCompleted, nil
		},
		Apply: func(ctx context.Context) error {
			name, err := backup.Create(ctx, &backup.CreateOptions{Options: backup.Options{Kube: r.o.Kube, Printer: r.p},
				Namespaces: r.namespaces, Wait: true, Holder: r.o.CommandLine})
			if name != "" {
				r.intent.Backup = name
			}
			if err != nil {
				return fmt.Errorf("%w; nothing else was changed: run the same command again for another backup, or pass --no-backup", err)
			}
			return nil
		},
	}
}

// rebootStep reboots the host and waits until its node is Ready on a new boot.
func (r *rebooter) rebootStep() workflow.Step {
	name := r.o.Worker
	booted := func(ctx context.Context) (bool, string, error) {
		n, err := r.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			p, err := kube.PendingGet("node "+name, err)
			return false, p, err
		}
		if id := n.Status.NodeInfo.BootID; id == "" || id == r.intent.BootID {
			return false, "node " + name + " still reports the boot before the reboot", nil
		}
		if st := cluster.NodeStatus(n); st != cluster.NodeReady {
			return false, "node " + name + " booted again and is " + st, nil
		}
		return true, "", nil
	}
	return workflow.Step{
		Name: "reboot", Title: "Reboot " + name + " (" + r.worker.Host + ")",
		Done: "Rebooted " + name + ", Ready again", Already: name + " already rebooted",
		Check: func(ctx context.Context) (bool, error) {
			done, _, err := booted(ctx)
			return done, err
		},
		Plan: func(context.Context) ([]string, error) {
			return []string{"systemctl reboot on " + r.worker.Host, fmt.Sprintf("wait up to %s for node %s to be Ready on its new boot", rebootTimeout, name)}, nil
		},
		Apply: func(ctx context.Context) error {
			// --no-block: systemctl answers before the host goes down and takes the connection.
			res, err := r.node.Run(ctx, sshx.Command("systemctl", "--no-block", "reboot"))
			if err == nil && res.ExitStatus != 0 {
				return fmt.Errorf("systemctl reboot on %s: exit status %d: %s", name, res.ExitStatus, strings.TrimSpace(string(res.Stderr)))
			}
			if err := kube.Poll(ctx, rebootTimeout, "node "+name+" Ready after its reboot", booted); err != nil {
				return fmt.Errorf("%w: see 'kip node list', and 'journalctl -u k3s-agent' on %s; run the same command again to keep waiting", err, r.worker.Host)
			}
			return nil
		},
	}
}

// uncordonStep lets pods be scheduled on the worker again.
func (r *rebooter) uncordonStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "uncordon", Title: "Uncordon " + name, Done: "Uncordoned " + name, Already: name + " already schedulable",
		Check: func(ctx context.Context) (bool, error) {
			n, err := r.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && !n.Spec.Unschedulable, err
		},
		Apply: func(ctx context.Context) error { return cordon(ctx, r.cl, name, false) },
	}
}

// workloadsStep waits until every workload that was Ready on the worker has rolled out again,
// wherever its pods now run.
func (r *rebooter) workloadsStep() workflow.Step {
	pending := func(ctx context.Context) (bool, string, error) {
		var waiting []string
		for _, w := range r.intent.Workloads {
			done, why, err := workloadRolledOut(ctx, r.cl, w)
			if err != nil {
				return false, "", err
			}
			if !done {
				waiting = append(waiting, why)
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; "), nil
	}
	return workflow.Step{
		Name: "workloads", Title: "Wait for the workloads that ran on " + r.o.Worker + " to be Ready",
		Done: "The workloads that ran on " + r.o.Worker + " are Ready", Already: "The workloads that ran on " + r.o.Worker + " are Ready",
		Check: func(ctx context.Context) (bool, error) {
			done, _, err := pending(ctx)
			return done, err
		},
		Apply: func(ctx context.Context) error {
			if err := kube.Poll(ctx, workloadsTimeout, "workloads Ready", pending); err != nil {
				return fmt.Errorf("%w: see 'kubectl get pods -A -o wide', and run the same command again to keep waiting", err)
			}
			return nil
		},
	}
}

// workloadRolledOut reports whether w has rolled out (kube.RolloutStatus); a workload deleted
// since the reboot began has nothing to wait for.
func workloadRolledOut(ctx context.Context, cl *kube.Clients, w workload) (bool, string, error) {
	obj, err := kube.GetWorkload(ctx, cl, w.Kind, w.Namespace, w.Name)
	switch {
	case apierrors.IsNotFound(err):
		return true, "", nil
	case err != nil:
		p, err := kube.PendingGet(w.String(), err)
		return false, p, err
	}
	return kube.RolloutStatus(obj)
}
