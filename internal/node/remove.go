package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/workflow"
)

// evictTimeout bounds the wait for Longhorn to rebuild the worker's copies on other nodes (a
// remove's, and a reboot's of copies only the worker holds).
const evictTimeout = 30 * time.Minute

// RemoveOptions is what kip node remove was asked to do, and what it takes from the command
// around it.
type RemoveOptions struct {
	Worker string // WORKER: the node's name
	// Force deregisters a worker whose host is powered off or gone (or, when it answers, stopped
	// by a fence) without moving its copies or draining it.
	Force  bool
	DryRun bool

	Env
}

// removeIntent is what a remove decided, kept in its progress record.
type removeIntent struct {
	Node  string `json:"node"`
	Force bool   `json:"force"`
	// Host and Address are the worker's, and Unreached whether kip reached neither over SSH,
	// as the remove's first run found them: a run that finds the worker already forgotten
	// (killed right after its last step) ends the remove with them.
	Host      string     `json:"host,omitempty"`
	Address   netip.Addr `json:"address,omitzero"`
	Unreached bool       `json:"unreached,omitempty"`
}

// remover is one run of kip node remove.
type remover struct {
	o      *RemoveOptions
	p      *cli.Printer
	cl     *kube.Clients
	nodes  cluster.Nodes
	worker cluster.Worker
	// apiNode is the worker's Node, nil when it is no longer in the API.
	apiNode *corev1.Node
	hosts
	serverFamily host.Family
	family       host.Family // the worker's, when reached
	fwServer     bool        // kip manages the server's firewall
	intent       removeIntent
	// forgotten: the worker is gone from the record and the cluster, and only this remove's
	// own unfinished run is left, killed right after its last step (forgetStep) forgot it.
	forgotten bool
}

func removeWorkflow(name string) string { return "node-remove-" + name }

// Remove takes a worker out of the cluster: its volume copies moved off, drained, wiped, deleted,
// and its address removed from every kip-managed firewall; or, with Force, deregisters a worker
// that is gone.
func Remove(ctx context.Context, o *RemoveOptions) error {
	r := &remover{o: o, p: o.Printer, intent: removeIntent{Node: o.Worker, Force: o.Force}}
	defer r.close()
	err := o.runWorkerCommand(ctx, workerCommand{
		verb: "remove", worker: o.Worker, dryRun: o.DryRun,
		examine: func(ctx context.Context) (*kube.Clients, error) {
			err := r.examine(ctx)
			return r.cl, err
		},
		question: r.question,
		workflow: func() *workflow.Workflow {
			return &workflow.Workflow{Name: removeWorkflow(o.Worker), Intent: &r.intent, Steps: r.steps()}
		},
	})
	if err == nil && !o.DryRun {
		r.summary()
	}
	return err
}

// examine reads the cluster and reaches the hosts the remove touches, refusing what kip node
// remove refuses before anything changes.
func (r *remover) examine(ctx context.Context) error {
	name := r.o.Worker
	t, err := readWorker(ctx, r.o.Kube, name, "kip node remove removes workers")
	r.cl = t.cl
	var gone noWorkerError
	if errors.As(err, &gone) {
		if r.forgotten, err = r.finishForgotten(ctx, err); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	rec, w := t.rec, t.worker
	r.nodes, r.apiNode = t.nodes, t.node
	status := ""
	if !r.forgotten {
		r.worker = w
		before, p, err := r.unfinished(ctx)
		if err != nil {
			return err
		}
		if err := r.checkResume(before, p); err != nil {
			return err
		}
		if r.apiNode != nil {
			status = cluster.NodeStatus(r.apiNode)
		}
		if err := r.checkFenced(status); err != nil {
			return err
		}
		r.intent.Host, r.intent.Address = w.Host, w.Path.Node
	}

	if r.server, err = r.o.dialServer(ctx, rec, "kip node remove reaches the server over SSH to update its firewall"); err != nil {
		return err
	}
	facts, err := r.server.Facts(ctx)
	if err != nil {
		return err
	}
	if r.serverFamily, err = host.Identify(facts.OS); err != nil {
		return err
	}
	fw, err := host.ReadFirewall(ctx, r.server)
	if err != nil {
		return err
	}
	r.fwServer = fw.Active && fw.Managed
	if r.forgotten {
		r.peers, err = dialPeers(ctx, r.o.Dial, r.nodes, name, "a remove")
		return err
	}
	if err := r.reachWorker(ctx, status); err != nil {
		return err
	}
	r.intent.Unreached = r.node == nil
	if r.apiNode != nil && !r.o.Force {
		if err := checkPods(ctx, r.cl, name); err != nil {
			return err
		}
	}
	r.peers, err = dialPeers(ctx, r.o.Dial, r.nodes, name, "a remove")
	return err
}

// checkFenced refuses what the worker's fence (its record, the truth; the taint is its effect)
// rules out before anything is reached: a remove without --force of a fenced worker, which
// cannot be drained; and --force on a worker with a node that no fence holds. Deleting that
// node makes Kubernetes force-delete its pods and lets other nodes attach its volumes, so it
// needs the fence's proof that the host no longer writes them. A resumed remove goes on.
func (r *remover) checkFenced(status string) error {
	name, w := r.o.Worker, r.worker
	fenced := w.Fence != nil || status == cluster.NodeOutOfService
	switch {
	case !r.o.Force && fenced:
		return fmt.Errorf("worker %s is fenced (out of service), and a remove moves its copies off and drains it, which needs it running: "+
			"bring it back with kip node add %s, or give it up with kip node remove %s --force", name, w.Host, name)
	case !r.o.Force || w.State == cluster.WorkerRemoving || r.apiNode == nil || w.Fence != nil:
		return nil
	case status == cluster.NodeReady:
		return fmt.Errorf("worker %s is Ready, so its host runs, and --force deregisters only a worker a fence holds: "+
			"run kip node remove %s without --force, which moves its copies off and drains it first", name, name)
	}
	return fmt.Errorf("worker %s is %s and no fence holds it, and --force deletes its node, after which Kubernetes force-deletes its pods and lets other nodes attach its volumes "+
		"while its host may still run and write them: fence it first with kip node fence %s (it stops the worker's k3s over SSH, or checks from the server that its kubelet is gone "+
		"and asks whether its host is powered off), then run kip node remove %s --force", name, status, name, name)
}

// checkResume refuses to resume an unfinished remove (p, its intent before) with the other
// --force.
func (r *remover) checkResume(before removeIntent, p *workflow.Progress) error {
	if p == nil || before.Force == r.o.Force {
		return nil
	}
	was := map[bool]string{true: "with --force", false: "without --force"}
	return fmt.Errorf("an unfinished kip node remove of %s (%s) started %s: run it again %s to resume it",
		r.o.Worker, p.StartedBy, was[before.Force], was[before.Force])
}

// unfinished returns the intent and progress of an unfinished remove of the worker, a nil
// progress when there is none.
func (r *remover) unfinished(ctx context.Context) (removeIntent, *workflow.Progress, error) {
	var before removeIntent
	p, err := workflow.Unfinished(ctx, r.cl.Dynamic, kube.ClusterRecords(), removeWorkflow(r.o.Worker), &before)
	return before, p, err
}

// finishForgotten decides, for a worker neither recorded nor a node (gone, readWorker's
// error), whether an unfinished remove of it forgot it last: then the run ends that remove
// (forgotten), with the worker as the remove's first run found it; otherwise gone stands.
func (r *remover) finishForgotten(ctx context.Context, gone error) (forgotten bool, err error) {
	before, p, err := r.unfinished(ctx)
	switch {
	case err != nil:
		return false, err
	case p == nil:
		return false, gone
	case before.Force != r.o.Force:
		return false, r.checkResume(before, p)
	}
	r.worker = cluster.Worker{Host: before.Host, Path: cluster.Path{Node: before.Address}}
	return true, nil
}

// reachWorker connects to the worker. Without --force it must answer and be Ready; with
// --force a host that answers must be held stopped by a fence, and one that does not is left as
// it is. A resumed remove (the worker recorded as removing) may find it NotReady, or its fence
// gone with its node, once it wiped the host.
func (r *remover) reachWorker(ctx context.Context, status string) error {
	name, w := r.o.Worker, r.worker
	resumed := w.State == cluster.WorkerRemoving
	c, err := r.o.Dial(ctx, w.Host)
	if err == nil {
		// A host at the address that is not the worker is left alone: without --force the
		// remove stops; with it, the worker counts as not answering.
		var id hostIdentity
		if id, err = readIdentity(ctx, c); err != nil {
			return err
		}
		if err = checkIdentity(id, name, w, r.apiNode); err != nil && !r.o.Force {
			return err
		}
	}
	if err != nil {
		if r.o.Force {
			r.p.Warn(fmt.Sprintf("%s does not answer over SSH at %s: kip deregisters it and leaves the host as it is", name, w.Host))
			return nil
		}
		return fmt.Errorf("a remove moves the worker's copies off, drains it and wipes it over SSH, and kip cannot reach %s at %s: %w; "+
			"fix SSH to it and run the same command again, or, when the host is powered off or gone for good, run kip node remove %s --force", name, w.Host, err, name)
	}
	r.node = c
	facts, err := c.Facts(ctx)
	if err != nil {
		return err
	}
	if r.family, err = host.Identify(facts.OS); err != nil {
		return fmt.Errorf("worker %s: %w", name, err)
	}
	if !r.o.Force {
		if r.apiNode != nil && status != cluster.NodeReady && !resumed {
			return fmt.Errorf("worker %s is %s, and a remove moves its copies off and drains it, which needs it Ready: "+
				"rejoin it with kip node add %s, then remove it; when the host is powered off or gone for good, run kip node remove %s --force", name, status, w.Host, name)
		}
		return nil
	}
	res, err := c.Probe(ctx, k3s.FencedCommand())
	if err != nil || res.ExitStatus == 0 {
		return err
	}
	if resumed {
		// This remove wiped the host already, the fence's drop-in with it.
		gone, err := c.Probe(ctx, k3s.AgentGoneCommand())
		if err != nil || gone.ExitStatus == 0 {
			return err
		}
	}
	return fmt.Errorf("%s still answers over SSH at %s, and the fence no longer holds it stopped (%s): "+
		"run kip node fence %s again, then kip node remove %s --force", name, w.Host,
		strings.ReplaceAll(strings.TrimSpace(string(res.Stdout)), "\n", "; "), name, name)
}

// question asks before the remove changes anything.
func (r *remover) question(ctx context.Context) string {
	name := r.o.Worker
	if !r.o.Force {
		return fmt.Sprintf("Remove worker %s (%s)? kip moves its volume copies to other nodes, drains it, wipes k3s and Longhorn's data from the host and deletes the node.", name, r.worker.Host)
	}
	q := fmt.Sprintf("Deregister worker %s (%s) without moving its copies or draining it? Its pods are deleted with the node.", name, r.worker.Host)
	if vols, err := r.volumesOn(ctx); err != nil {
		q += " (kip cannot list its volume copies: " + err.Error() + ")"
	} else if len(vols) > 0 {
		q += " The copies of these volumes on it are lost: " + strings.Join(vols, ", ") + "."
	}
	return q
}

// volumesOn names the volumes with a copy on the worker.
func (r *remover) volumesOn(ctx context.Context) ([]string, error) {
	// Longhorn labels each replica with its node.
	replicas, err := r.cl.Longhorn.LonghornV1beta2().Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "longhornnode=" + r.o.Worker})
	if err != nil {
		return nil, err
	}
	var vols []string
	for _, rp := range replicas.Items {
		if !slices.Contains(vols, rp.Spec.VolumeName) {
			vols = append(vols, rp.Spec.VolumeName)
		}
	}
	slices.Sort(vols)
	return vols, nil
}

// steps are the remove's steps, in order.
func (r *remover) steps() []workflow.Step {
	if r.forgotten {
		return []workflow.Step{r.forgetStep()}
	}
	steps := []workflow.Step{r.recordStep()}
	if r.apiNode != nil && !r.o.Force {
		steps = append(steps, r.copiesStep(), drainStep(r.cl, r.o.Worker))
	}
	if r.node != nil {
		steps = append(steps, r.wipeStep())
		if r.worker.FirewallManaged {
			// Only SSH stays open on a host that is no node.
			steps = append(steps, r.family.FirewallStep("worker-firewall", r.o.Worker, r.node, host.WorkerRules(sshPort(r.node))))
		}
	}
	steps = append(steps, r.deleteStep())
	if r.fwServer {
		steps = append(steps, r.serverFamily.FirewallStep("server-firewall", "the server", r.server,
			host.ServerFirewall(sshPort(r.server), r.nodes.WorkerAddresses(r.o.Worker))))
	}
	for _, name := range sortedPeers(r.peers) {
		if p := r.peers[name]; p.worker.FirewallManaged {
			steps = append(steps, p.family.FirewallStep("peer-firewall-"+name, name, p.c,
				host.WorkerFirewall(sshPort(p.c), r.nodes.Server, r.nodes.PeerAddrs(name, r.o.Worker))))
		}
	}
	return append(steps, r.forgetStep())
}

func (r *remover) recordStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "record", Title: "Record worker " + name + " as being removed",
		Done: "Recorded worker " + name + " as being removed", Already: "Worker " + name + " already recorded as being removed",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, r.cl.Dynamic)
			return n.Workers[name].State == cluster.WorkerRemoving, err
		},
		Apply: func(ctx context.Context) error {
			return cluster.UpdateWorker(ctx, r.cl.Dynamic, name, func(w *cluster.Worker) { w.State = cluster.WorkerRemoving })
		},
	}
}

// copiesStep has Longhorn move every copy off the worker: scheduling there turned off and
// eviction requested on its Longhorn node, after which Longhorn rebuilds each replica on another
// node and deletes the one on the worker.
func (r *remover) copiesStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "copies", Title: "Move the volume copies on " + name + " to other nodes",
		Done: "No volume copies left on " + name, Already: "No volume copies on " + name,
		Check: func(ctx context.Context) (bool, error) {
			vols, err := r.volumesOn(ctx)
			if err != nil || len(vols) > 0 {
				return false, err
			}
			n, err := r.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil && !n.Spec.AllowScheduling && n.Spec.EvictionRequested, err
		},
		Apply: func(ctx context.Context) error {
			patch := []byte(`{"spec":{"allowScheduling":false,"evictionRequested":true}}`)
			_, err := r.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kip"})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("ask Longhorn to move the copies off %s: %w", name, err)
			}
			err = kube.Poll(ctx, evictTimeout, "the volume copies moved off "+name, func(ctx context.Context) (bool, string, error) {
				vols, err := r.volumesOn(ctx)
				return err == nil && len(vols) == 0, "copies of " + strings.Join(vols, ", ") + " still there", err
			})
			if err != nil {
				return fmt.Errorf("%w: Longhorn rebuilds each copy on another node that can hold it; see 'kubectl -n %s get replicas.longhorn.io -l longhornnode=%s', "+
					"and run the same command again to keep waiting", err, longhorn.Namespace, name)
			}
			return nil
		},
	}
}

// wipeStep removes k3s-agent, its containers and data from the host. A forced remove keeps
// Longhorn's data there, since its copies did not move.
func (r *remover) wipeStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "wipe", Title: "Wipe k3s from " + name + " (" + r.worker.Host + ")",
		Done: "Wiped k3s from " + name, Already: "k3s already wiped from " + name,
		Check: func(ctx context.Context) (bool, error) {
			res, err := r.node.Probe(ctx, k3s.AgentGoneCommand())
			return err == nil && res.ExitStatus == 0, err
		},
		Plan: func(context.Context) ([]string, error) {
			p := []string{"stop and disable " + k3s.AgentUnit + ", stop its containers", "delete k3s's files, mounts, network interfaces and iptables rules"}
			if !r.o.Force {
				p = append(p, "empty "+cluster.LonghornDir)
			}
			return p, nil
		},
		Apply: func(ctx context.Context) error {
			if _, err := r.node.Output(ctx, k3s.WipeAgentCommand(r.o.Force)); err != nil {
				return fmt.Errorf("wipe k3s from %s: %w", name, err)
			}
			return nil
		},
	}
}

// deleteStep deletes the worker's Node and its Longhorn node.
func (r *remover) deleteStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "node", Title: "Delete node " + name + " from the cluster",
		Done: "Deleted node " + name, Already: "Node " + name + " already deleted",
		Check: func(ctx context.Context) (bool, error) {
			_, err := r.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, ignoreFound(err)
			}
			_, err = r.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), ignoreFound(err)
		},
		Apply: func(ctx context.Context) error {
			if err := r.cl.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete node %s: %w", name, err)
			}
			// Longhorn refuses to delete a node it still counts as up: it marks it down once the
			// Kubernetes node is gone.
			return kube.Poll(ctx, joinTimeout, "Longhorn's node "+name+" deleted", func(ctx context.Context) (bool, string, error) {
				err := r.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
				if err == nil || apierrors.IsNotFound(err) {
					return true, "", nil
				}
				return false, err.Error(), nil
			})
		},
	}
}

func (r *remover) forgetStep() workflow.Step {
	name := r.o.Worker
	return workflow.Step{
		Name: "forget", Title: "Remove worker " + name + " from kip's record",
		Done: "Removed worker " + name + " from kip's record", Already: "Worker " + name + " already gone from kip's record",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, r.cl.Dynamic)
			_, ok := n.Workers[name]
			return !ok, err
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateNodes(ctx, r.cl.Dynamic, func(n *cluster.Nodes) error {
				delete(n.Workers, name)
				return nil
			})
			return err
		},
	}
}

// summary ends the remove: the firewall rules the operator must remove, and what became of a
// host kip did not reach.
func (r *remover) summary() {
	name, addr := r.o.Worker, r.worker.Path.Node
	r.p.Success("Removed worker " + name)
	ports := host.Describe(host.PeerRules([]netip.Addr{addr}, netip.Addr{}))
	if !r.fwServer {
		r.p.Info("The server's firewall is yours: remove the rules that allow " + ports)
	}
	for _, pn := range sortedPeers(r.peers) {
		if !r.peers[pn].worker.FirewallManaged {
			r.p.Info(fmt.Sprintf("Worker %s's firewall is yours: remove the rules that allow %s", pn, ports))
		}
	}
	r.p.Info(fmt.Sprintf("Remove %s from your provider's firewall or security group rules for the nodes", addr))
	switch {
	case r.node == nil && (!r.forgotten || r.intent.Unreached):
		r.p.Warn(fmt.Sprintf("kip did not reach %s, so k3s-agent is still installed there with the cluster's join token: "+
			"before that host starts again, reinstall it or keep it from starting k3s-agent ('systemctl disable k3s-agent'), or it registers again", r.worker.Host))
	case r.o.Force:
		r.p.Info(fmt.Sprintf("Longhorn's data on %s stays in %s: delete it once you no longer need it", r.worker.Host, cluster.LonghornDir))
	}
}
