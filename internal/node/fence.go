package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// The fence's times.
const (
	// FenceAfter is how long a worker must have been NotReady before kip fences it.
	FenceAfter = time.Minute
	// fenceSettle is how long the out-of-service taint acts on its own (Kubernetes deleting the
	// node's pods and detaching their volumes) before kip deletes the Kipper pods left.
	fenceSettle = time.Minute
	// fencePodsTimeout bounds the wait for those pods' volume attachments to go.
	fencePodsTimeout = 10 * time.Minute
	// fenceStartTimeout bounds the wait for the services that move to run elsewhere.
	fenceStartTimeout = 5 * time.Minute
	// fenceStopTimeout bounds the wait for console-api to scale the StatefulSets of the
	// services the fence stops to zero, before the taint.
	fenceStopTimeout = 5 * time.Minute
)

// OutOfServiceValue is the value of the out-of-service taint, as Kubernetes' documentation of
// non-graceful node shutdown gives it.
const OutOfServiceValue = "nodeshutdown"

// FenceOptions is what kip node fence was asked to do, and what it takes from the command
// around it.
type FenceOptions struct {
	Worker string // WORKER: the node's name
	// PoweredOff confirms, for a worker that does not answer over SSH, that its host is powered
	// off and stays off until it rejoins.
	PoweredOff bool
	// AcceptStale lets a service start on copies of its data that may be older.
	AcceptStale bool
	DryRun      bool

	Env
}

// fenceIntent is what a fence decided, kept in its progress record so that a resumed fence
// acts on the same decisions.
type fenceIntent struct {
	Node string `json:"node"`
	// BootID is the host's boot when fenced: read over SSH, or its node's last report.
	BootID     string `json:"bootID,omitempty"`
	PoweredOff bool   `json:"poweredOff,omitempty"`
	// Services are the Kipper services with a single-node volume on the worker, and what the
	// fence does with each; Jobs the Jobs it suspends (namespace/name); Others the other pods
	// there with single-node volumes, which it only warns about.
	Services []fencedService `json:"services,omitempty"`
	Jobs     []string        `json:"jobs,omitempty"`
	Others   []string        `json:"others,omitempty"`
	// CutOff are the Longhorn volumes whose engine ran on the worker when it answered kip over
	// SSH but could not reach the server's API (fencer.serverCut): their copies elsewhere are not
	// known to be current (longhorn.Distrust).
	CutOff []string `json:"cutOff,omitempty"`
}

// fencedService is a Kipper service with a single-node volume on the fenced worker.
type fencedService struct {
	service.Ref
	// Data is longhorn.Judge of its copies without the worker.
	Data string `json:"data"`
	// Accepted: the operator accepted copies that may be older.
	Accepted bool `json:"accepted,omitempty"`
	// CurrentOn are the nodes with a current copy of every volume of it.
	CurrentOn []string `json:"currentOn,omitempty"`
	// Why says why it stays stopped ("" when it starts elsewhere).
	Why string `json:"why,omitempty"`
}

// stoppedRef is the service the fence's record names.
func stoppedRef(s cluster.StoppedService) service.Ref {
	return service.Ref{Project: s.Project, Environment: s.Environment, Name: s.Name}
}

// stays reports whether the fence stops the service.
func (s fencedService) stays() bool { return s.Why != "" }

// fencer is one run of kip node fence.
type fencer struct {
	o      *FenceOptions
	p      *cli.Printer
	cl     *kube.Clients
	worker cluster.Worker
	rec    cluster.Record
	node   *sshx.Client // nil when the host does not answer
	// serverCut: the host answers kip but does not reach the server's API, or kip could not tell
	// (serverReach); decide records the volumes it affects in the intent.
	serverCut bool
	intent    fenceIntent
}

func fenceWorkflow(name string) string { return "node-fence-" + name }

// Fence fences a worker that stopped reporting, so that other nodes can take over its
// services' volumes without two hosts writing one volume.
func Fence(ctx context.Context, o *FenceOptions) error {
	f := &fencer{o: o, p: o.Printer, intent: fenceIntent{Node: o.Worker, PoweredOff: o.PoweredOff}}
	defer func() {
		if f.node != nil {
			f.node.Close()
		}
	}()
	err := o.runWorkerCommand(ctx, workerCommand{
		verb: "fence", worker: o.Worker, dryRun: o.DryRun,
		examine: func(ctx context.Context) (*kube.Clients, error) {
			err := f.examine(ctx)
			return f.cl, err
		},
		question: f.question,
		workflow: func() *workflow.Workflow {
			return &workflow.Workflow{Name: fenceWorkflow(o.Worker), Intent: &f.intent, Steps: f.steps()}
		},
	})
	if err == nil && !o.DryRun {
		f.report(ctx)
	}
	return err
}

// examine reads the cluster and the worker, refusing what kip node fence refuses before anything
// changes, and decides what happens to each service on the worker.
func (f *fencer) examine(ctx context.Context) error {
	name := f.o.Worker
	t, err := readWorker(ctx, f.o.Kube, name, "kip node fence fences workers, and a cluster without its server has no API to fence with")
	f.cl = t.cl
	w, n := t.worker, t.node
	switch {
	case err != nil:
		return err
	case w.State == cluster.WorkerRemoving:
		return fmt.Errorf("worker %s is being removed: run kip node remove %s --force to deregister it", name, name)
	case n == nil:
		return fmt.Errorf("worker %s has no node in the cluster, so nothing runs there to fence: run kip node remove %s --force to deregister it", name, name)
	}
	f.worker, f.rec = w, t.rec
	p, err := workflow.Unfinished(ctx, f.cl.Dynamic, kube.ClusterRecords(), fenceWorkflow(name), nil)
	if err != nil {
		return err
	}
	resumed := p != nil
	if !resumed && w.Fence == nil {
		if err := checkNotReady(n, time.Now()); err != nil {
			return err
		}
	}
	if err := f.reach(ctx, n); err != nil {
		return err
	}
	if resumed {
		return nil // the runner loads what the fence decided from its progress record
	}
	return f.decide(ctx)
}

// checkNotReady refuses a node that has not been NotReady (or Unknown) for at least FenceAfter
// at now: a fence is for a worker that stopped reporting, and a minute keeps it from acting on
// a blip.
func checkNotReady(n *corev1.Node, now time.Time) error {
	var ready *corev1.NodeCondition
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			ready = &n.Status.Conditions[i]
		}
	}
	switch {
	case ready != nil && ready.Status == corev1.ConditionTrue:
		return fmt.Errorf("worker %s is Ready, and a fence is for a worker that stopped reporting: "+
			"to take it out of service, run kip node reboot %s or kip node remove %s", n.Name, n.Name, n.Name)
	case ready == nil || ready.LastTransitionTime.IsZero():
		return nil // it never reported Ready, so it has not for any minute
	}
	if since := now.Sub(ready.LastTransitionTime.Time); since < FenceAfter {
		return fmt.Errorf("worker %s has been %s for %s only, and a fence needs it not reporting for at least %s, so that a short network blip is not taken for a dead host: "+
			"run the same command again after %s", n.Name, cluster.NodeStatus(n), since.Round(time.Second), FenceAfter,
			ready.LastTransitionTime.Add(FenceAfter).Local().Format(time.TimeOnly))
	}
	return nil
}

// reach connects to the worker. A host that does not answer, or answers as another machine
// (checkIdentity: the fence stops nothing there), must be confirmed powered off, and its kubelet
// must not answer the server at the worker's recorded address.
func (f *fencer) reach(ctx context.Context, n *corev1.Node) error {
	name, w := f.o.Worker, f.worker
	c, dialErr := f.o.Dial(ctx, w.Host)
	if dialErr == nil {
		id, err := readIdentity(ctx, c)
		if err != nil {
			return err
		}
		if dialErr = checkIdentity(id, name, w, n); dialErr == nil {
			f.node = c
			f.intent.BootID, f.intent.PoweredOff = id.BootID, false
			return f.serverReach(ctx)
		}
	}
	f.p.Warn(fmt.Sprintf("%s does not answer over SSH at %s: %v", name, w.Host, dialErr))
	if w.Fence != nil && w.Fence.BootID != "" {
		f.intent.BootID = w.Fence.BootID
	} else {
		f.intent.BootID = n.Status.NodeInfo.BootID
	}
	f.intent.PoweredOff = true
	if !f.o.PoweredOff && !f.o.DryRun {
		ok, err := f.o.Prompter.Consent(fmt.Sprintf("Is the host of %s (%s) powered off, and will it stay off until you rejoin it with %s?", name, w.Host, service.RejoinCommand(w.Host)))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("kip cannot reach %s over SSH to stop its k3s, so a fence relies on its host being powered off: "+
				"once you know it is off and stays off until it rejoins, run kip node fence %s --powered-off", name, name)
		}
	}
	return f.kubeletGone(ctx)
}

// serverReach checks, from a worker that answers kip over SSH, whether it reaches the server's
// API, which its Longhorn manager records the state of its volumes' copies through. A worker that
// stopped reporting but answers kip is most often cut off from the server: then what Longhorn
// says of the copies of the volumes whose engine ran there is only what it reported before, and
// decide does not call them current. A check that cannot run counts as cut off.
func (f *fencer) serverReach(ctx context.Context) error {
	name, server := f.o.Worker, f.worker.Path.Server
	if !server.Is4() {
		f.serverCut = true
		f.p.Warn(fmt.Sprintf("kip has no server address recorded for %s to check that it reaches the server's API: Longhorn's view of the copies of its volumes counts as out of date", name))
		return nil
	}
	reaches, err := Connects(ctx, f.node, server, apiPort)
	if err != nil {
		f.p.Warn(fmt.Sprintf("kip could not check whether %s reaches the server's API at %s:%d (%v): Longhorn's view of the copies of its volumes counts as out of date", name, server, apiPort, err))
	}
	f.serverCut = err != nil || !reaches
	if err == nil && !reaches {
		f.p.Warn(fmt.Sprintf("%s answers kip but does not reach the server's API at %s:%d: Longhorn could not record what happened to the copies of the volumes it ran since it lost the server", name, server, apiPort))
	}
	return nil
}

// kubeletGone checks from the server that the worker's kubelet no longer answers at its recorded
// address, refusing when it does or when the check cannot run.
func (f *fencer) kubeletGone(ctx context.Context) error {
	name, w := f.o.Worker, f.worker
	addr := w.Path.Node
	if !addr.Is4() {
		return fmt.Errorf("worker %s's recorded address %q is no IPv4 address, so the server cannot check that its kubelet is gone: fix its record with %s, or remove it with kip node remove %s --force",
			name, addr, service.RejoinCommand(w.Host), name)
	}
	// The factory's connection, closed as kip exits.
	server, err := f.o.dialServer(ctx, f.rec, "kip node fence checks from the server that the worker's kubelet no longer answers")
	if err != nil {
		return fmt.Errorf("%w; the fence cannot go ahead without that check", err)
	}
	answers, err := Connects(ctx, server, addr, host.KubeletPort)
	if err != nil {
		return fmt.Errorf("check from the server whether the kubelet of %s answers at %s: %w; the fence cannot go ahead without that check", name, addr, err)
	}
	if answers {
		return fmt.Errorf("the kubelet of %s still answers the server at %s:%d, so its host runs and may still write to its volumes, though kip cannot reach it over SSH at %s: "+
			"power it off (or fix SSH to it, so that kip stops its k3s), then run kip node fence %s again", name, addr, host.KubeletPort, w.Host, name)
	}
	return nil
}

// decide finds the Kipper services, Jobs and other pods with single-node volumes on the worker,
// and what the fence does with each service: it starts elsewhere when another node holds a
// current copy of every one of its volumes, or when the operator accepts copies that may be
// older; otherwise it stays stopped.
func (f *fencer) decide(ctx context.Context) error {
	name := f.o.Worker
	found, err := onWorker(ctx, f.cl, name)
	if err != nil {
		return err
	}
	f.intent.Jobs, f.intent.Others = found.jobs, found.others
	if f.serverCut {
		if f.intent.CutOff, err = enginesOn(ctx, f.cl, name); err != nil {
			return err
		}
	}
	var consent func(string) (bool, error) // a dry run asks nothing
	if !f.o.DryRun {
		consent = f.o.Prompter.Consent
	}
	for _, s := range found.services {
		d, err := service.DecideStart(ctx, f.cl, s, name, f.intent.CutOff, f.o.AcceptStale, consent)
		if err != nil {
			return err
		}
		f.intent.Services = append(f.intent.Services,
			fencedService{Ref: s.Ref, Data: d.Verdict, Accepted: d.Accepted, CurrentOn: d.CurrentOn, Why: d.FenceWhy(name)})
	}
	return nil
}

// enginesOn names the Longhorn volumes whose engine runs on node, as Longhorn last recorded it
// (attached there, or to be), sorted.
func enginesOn(ctx context.Context, cl *kube.Clients, node string) ([]string, error) {
	vols, err := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's volumes: %w", err)
	}
	var out []string
	for _, v := range vols.Items {
		if v.Status.CurrentNodeID == node || v.Spec.NodeID == node {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// found is what runs on a worker with a single-node volume.
type found struct {
	services []*service.Service
	jobs     []string // namespace/name
	others   []string // namespace/pod
}

// onWorker finds the Kipper services, Jobs and other pods with a single-node (ReadWriteOnce)
// volume attached to node or mounted by a pod there, and the services node's fence stopped. A
// service already stopped by its operator is left out: it stays stopped anyway.
func onWorker(ctx context.Context, cl *kube.Clients, node string) (found, error) {
	var out found
	pvs := map[string]*corev1.PersistentVolume{} // single-node volumes on node, by claim ns/name
	list, err := cl.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return out, fmt.Errorf("list volumes: %w", err)
	}
	byName := map[string]*corev1.PersistentVolume{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	addPV := func(name string) {
		if pv := byName[name]; pv != nil && pv.Spec.ClaimRef != nil && longhorn.SingleNode(pv) {
			pvs[pv.Spec.ClaimRef.Namespace+"/"+pv.Spec.ClaimRef.Name] = pv
		}
	}
	attached, err := attachedTo(ctx, cl, node)
	if err != nil {
		return out, err
	}
	for _, pv := range attached {
		addPV(pv)
	}
	pods, err := cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return out, fmt.Errorf("list the pods on %s: %w", node, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			pvc, err := cl.Kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return out, fmt.Errorf("read claim %s/%s: %w", p.Namespace, v.PersistentVolumeClaim.ClaimName, err)
			}
			if err == nil {
				addPV(pvc.Spec.VolumeName)
			}
		}
	}
	services, err := service.List(ctx, cl.Dynamic, cl.Kube)
	if err != nil {
		return out, err
	}
	claimed := map[string]bool{} // claims of Kipper services
	onNode := map[string]bool{}
	for key := range pvs {
		onNode[key] = true
	}
	for _, s := range services {
		for _, c := range s.Claims() {
			claimed[s.Namespace()+"/"+c] = true
		}
	}
	out.services = service.OnNode(services, onNode, node)
	for i := range pods.Items {
		p := &pods.Items[i]
		var holds bool
		for _, v := range p.Spec.Volumes {
			key := p.Namespace + "/"
			if v.PersistentVolumeClaim != nil {
				key += v.PersistentVolumeClaim.ClaimName
			}
			holds = holds || v.PersistentVolumeClaim != nil && pvs[key] != nil && !claimed[key]
		}
		if !holds {
			continue
		}
		if owner := metav1.GetControllerOf(p); owner != nil && owner.Kind == "Job" {
			if j := p.Namespace + "/" + owner.Name; !slices.Contains(out.jobs, j) {
				out.jobs = append(out.jobs, j)
			}
			continue
		}
		if p.Labels[service.Label] == "" {
			out.others = append(out.others, p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out.jobs)
	slices.Sort(out.others)
	return out, nil
}

// question asks before the fence changes anything, saying what it does with each service.
func (f *fencer) question(context.Context) string {
	name := f.o.Worker
	var b strings.Builder
	fmt.Fprintf(&b, "Fence worker %s (%s)? ", name, f.worker.Host)
	if f.node != nil {
		b.WriteString("kip keeps its k3s-agent from starting, also after a reboot, and stops it and every container there; ")
	} else {
		b.WriteString("Its host does not answer and must stay powered off until it rejoins; ")
	}
	b.WriteString("the node is tainted out of service, so Kubernetes deletes its pods and detaches their volumes.")
	for _, s := range f.intent.Services {
		if s.stays() {
			fmt.Fprintf(&b, "\n  service %s stays stopped: %s", s.Ref, s.Why)
		} else {
			fmt.Fprintf(&b, "\n  service %s starts on another node (%s)", s.Ref, s.where())
		}
	}
	for _, j := range f.intent.Jobs {
		fmt.Fprintf(&b, "\n  Job %s is suspended", j)
	}
	return b.String()
}

// where says which copies a moving service starts on.
func (s fencedService) where() string {
	switch {
	case len(s.CurrentOn) > 0:
		return "current copies on " + strings.Join(s.CurrentOn, ", ")
	case s.Accepted:
		return "copies that may be older, as you accepted"
	}
	return "a current copy of each of its volumes on other nodes"
}
