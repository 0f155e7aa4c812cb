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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
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
	unfinished, err := workflow.ListUnfinished(ctx, f.cl.Dynamic, kube.ClusterRecords())
	if err != nil {
		return err
	}
	resumed := slices.ContainsFunc(unfinished, func(p workflow.Progress) bool { return p.Workflow == fenceWorkflow(name) })
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
		ok, err := f.o.Prompter.Consent(fmt.Sprintf("Is the host of %s (%s) powered off, and will it stay off until you rejoin it with kip node add %s?", name, w.Host, w.Host))
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
		return fmt.Errorf("worker %s's recorded address %q is no IPv4 address, so the server cannot check that its kubelet is gone: fix its record with kip node add %s, or remove it with kip node remove %s --force",
			name, addr, w.Host, name)
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
	for _, s := range found.services {
		verdict, copies, err := service.FencedData(ctx, f.cl, s, name, f.intent.CutOff)
		if err != nil {
			return err
		}
		fs := fencedService{Ref: s.Ref, Data: verdict, CurrentOn: longhorn.CurrentOn(copies, name)}
		switch verdict {
		case longhorn.DataOnlyThere:
			fs.Why = service.DataWhy(verdict, name, nil)
		case longhorn.DataStale:
			fs.Accepted = f.o.AcceptStale
			if !fs.Accepted && !f.o.DryRun {
				if fs.Accepted, err = f.o.Prompter.Consent(service.StaleQuestion(s, name, copies)); err != nil {
					return err
				}
			}
			if !fs.Accepted {
				fs.Why = service.DataWhy(verdict, name, nil) + ", and older data was not accepted"
			}
		}
		f.intent.Services = append(f.intent.Services, fs)
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

// steps are the fence's steps, in order.
func (f *fencer) steps() []workflow.Step {
	steps := []workflow.Step{f.recordStep()}
	if f.node != nil {
		steps = append(steps, f.stopStep())
	}
	return append(steps, f.servicesStep(), f.taintStep(), f.podsStep())
}

// recordStep records the fence in the nodes record before anything else changes.
func (f *fencer) recordStep() workflow.Step {
	name := f.o.Worker
	return workflow.Step{
		Name: "record", Title: "Record the fence of " + name,
		Done: "Recorded the fence of " + name, Already: "The fence of " + name + " is already recorded",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, f.cl.Dynamic)
			return n.Workers[name].Fence != nil, err
		},
		Apply: func(ctx context.Context) error {
			return cluster.UpdateWorker(ctx, f.cl.Dynamic, name, func(w *cluster.Worker) {
				w.Fence = &cluster.FenceRecord{At: time.Now().UTC(), BootID: f.intent.BootID, PoweredOff: f.intent.PoweredOff, CutOff: f.intent.CutOff}
			})
		},
	}
}

// stopStep keeps k3s-agent from starting on a worker that answers, stops it and every container,
// and checks that nothing of them is left running or mounted.
func (f *fencer) stopStep() workflow.Step {
	name := f.o.Worker
	return workflow.Step{
		Name: "stop", Title: "Stop k3s and every container on " + name + ", and keep k3s-agent from starting",
		Done: "Stopped k3s and every container on " + name + " (k3s-agent stays stopped, also after a reboot)", Already: "k3s is already stopped on " + name + " by the fence",
		Check: func(ctx context.Context) (bool, error) {
			res, err := f.node.Probe(ctx, k3s.FencedCommand())
			if err != nil {
				return false, err
			}
			return res.ExitStatus == 0, nil
		},
		Plan: func(context.Context) ([]string, error) {
			return []string{"install " + k3s.FenceDropIn, "stop " + k3s.AgentUnit + " and its containers, unmount their volumes", "check that no container, Longhorn process or Longhorn mount is left"}, nil
		},
		Apply: func(ctx context.Context) error {
			res, err := f.node.Run(ctx, k3s.FenceAgentCommand())
			if err != nil {
				return err
			}
			if res.ExitStatus != 0 {
				return fmt.Errorf("still on %s after stopping k3s: %s; stop it by hand or power the host off, then run the same command again",
					name, strings.ReplaceAll(strings.TrimSpace(string(res.Stdout)), "\n", "; "))
			}
			return nil
		},
	}
}

// servicesStep stops the services that cannot start elsewhere (FenceAnnotation records why the
// service is stopped) and suspends the Jobs, recording both in the fence for the rejoin, then
// waits until console-api has scaled those services' StatefulSets to zero.
func (f *fencer) servicesStep() workflow.Step {
	name := f.o.Worker
	stays := func() []fencedService {
		var out []fencedService
		for _, s := range f.intent.Services {
			if s.stays() {
				out = append(out, s)
			}
		}
		return out
	}
	return workflow.Step{
		Name: "services", Title: "Stop the services that cannot start without " + name + ", suspend its Jobs",
		Done: "Stopped the services that wait for " + name + " and suspended its Jobs", Already: "The services that wait for " + name + " are stopped and its Jobs suspended",
		Check: func(ctx context.Context) (bool, error) {
			for _, fs := range stays() {
				s, err := service.Get(ctx, f.cl.Dynamic, fs.Ref)
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil || s.FenceStop != name || !s.Stopped {
					return false, ignoreFound(err)
				}
			}
			for _, j := range f.intent.Jobs {
				ns, jn, _ := strings.Cut(j, "/")
				job, err := f.cl.Kube.BatchV1().Jobs(ns).Get(ctx, jn, metav1.GetOptions{})
				if err != nil && !apierrors.IsNotFound(err) || err == nil && !ptr.Deref(job.Spec.Suspend, false) {
					return false, ignoreFound(err)
				}
			}
			n, err := cluster.ReadNodes(ctx, f.cl.Dynamic)
			fence := n.Workers[name].Fence
			if err != nil || fence == nil {
				return false, err
			}
			for _, fs := range stays() {
				if !slices.ContainsFunc(fence.Stopped, func(s cluster.StoppedService) bool { return stoppedRef(s) == fs.Ref }) {
					return false, nil
				}
			}
			if slices.ContainsFunc(f.intent.Jobs, func(j string) bool { return !slices.Contains(fence.Suspended, j) }) {
				return false, nil
			}
			pending, err := f.notScaledDown(ctx, stays())
			return pending == "", err
		},
		Apply: func(ctx context.Context) error {
			for _, fs := range stays() {
				if err := service.SetFenceStop(ctx, f.cl.Dynamic, fs.Ref, name); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			for _, j := range f.intent.Jobs {
				ns, jn, _ := strings.Cut(j, "/")
				_, err := f.cl.Kube.BatchV1().Jobs(ns).Patch(ctx, jn, types.MergePatchType, []byte(`{"spec":{"suspend":true}}`), metav1.PatchOptions{FieldManager: kube.FieldManager})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("suspend Job %s: %w", j, err)
				}
			}
			if err := cluster.UpdateWorker(ctx, f.cl.Dynamic, name, func(w *cluster.Worker) {
				if w.Fence == nil {
					w.Fence = &cluster.FenceRecord{} // lifted meanwhile: the services stopped now still need a record
				}
				// Added to what an earlier run of the fence recorded, which a rejoin undoes.
				for _, fs := range stays() {
					if !slices.ContainsFunc(w.Fence.Stopped, func(s cluster.StoppedService) bool { return stoppedRef(s) == fs.Ref }) {
						w.Fence.Stopped = append(w.Fence.Stopped, cluster.StoppedService{Project: fs.Project, Environment: fs.Environment, Name: fs.Name, Why: fs.Data})
					}
				}
				for _, j := range f.intent.Jobs {
					if !slices.Contains(w.Fence.Suspended, j) {
						w.Fence.Suspended = append(w.Fence.Suspended, j)
					}
				}
			}); err != nil {
				return err
			}
			// The taint makes Kubernetes delete the services' pods on the worker: a
			// StatefulSet console-api has not scaled to zero yet would start its pod again on
			// another node, on copies the fence decided not to use.
			err := kube.PollPending(ctx, fenceStopTimeout, "console-api to scale the stopped services to zero", func(ctx context.Context) (string, error) {
				return f.notScaledDown(ctx, stays())
			})
			if err != nil {
				return fmt.Errorf("%w: kip does not taint %s before console-api has scaled them to zero, or Kubernetes would start them again on another node on copies the fence did not choose; "+
					"check that console-api runs ('kip status'), then run kip node fence %s again", err, name, name)
			}
			return nil
		},
	}
}

// notScaledDown names the StatefulSets of services that console-api has not scaled to zero
// yet ("" when all are): replicas above zero, or a change its controller has not seen.
func (f *fencer) notScaledDown(ctx context.Context, services []fencedService) (string, error) {
	var pending []string
	for _, fs := range services {
		sts, err := f.cl.Kube.AppsV1().StatefulSets(fs.Namespace()).Get(ctx, fs.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return "", err
		case ptr.Deref(sts.Spec.Replicas, 1) > 0 || sts.Status.ObservedGeneration < sts.Generation:
			pending = append(pending, fmt.Sprintf("StatefulSet %s/%s at %d replicas", sts.Namespace, sts.Name, ptr.Deref(sts.Spec.Replicas, 1)))
		}
	}
	return strings.Join(pending, ", "), nil
}

// taintStep taints the node out of service: Kubernetes then deletes its pods and detaches their
// volumes, so that they can start on another node.
func (f *fencer) taintStep() workflow.Step {
	name := f.o.Worker
	return workflow.Step{
		Name: "taint", Title: "Taint " + name + " " + cluster.OutOfServiceTaint,
		Done: "Tainted " + name + " out of service", Already: name + " already tainted out of service",
		Check: func(ctx context.Context) (bool, error) {
			n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && hasTaint(n, cluster.OutOfServiceTaint), err
		},
		Apply: func(ctx context.Context) error {
			if err := f.stillDown(ctx); err != nil {
				return err
			}
			err := updateNode(ctx, f.cl, name, func(n *corev1.Node) bool {
				if hasTaint(n, cluster.OutOfServiceTaint) {
					return false
				}
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: cluster.OutOfServiceTaint, Value: OutOfServiceValue,
					Effect: corev1.TaintEffectNoExecute, TimeAdded: ptr.To(metav1.Now())})
				return true
			})
			if err != nil {
				return fmt.Errorf("taint %s out of service: %w", name, err)
			}
			return nil
		},
	}
}

// stillDown repeats, under the cluster lock and just before the taint, the checks kip made of the
// worker before it asked: its node is still not Ready, and its host is still held stopped (the
// fence's drop-in in place, nothing running or mounted) or, for a host that did not answer, its
// kubelet still does not answer the server; and each service the fence lets start elsewhere
// still has the copies it was judged on. The taint releases the worker's volumes to other
// nodes: a worker that came back since must not lose them to a second writer, nor may a
// service start on copies nobody chose.
func (f *fencer) stillDown(ctx context.Context) error {
	name := f.o.Worker
	for _, fs := range f.intent.Services {
		if fs.stays() {
			continue
		}
		s, err := service.Get(ctx, f.cl.Dynamic, fs.Ref)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		verdict, _, err := service.FencedData(ctx, f.cl, s, name, f.intent.CutOff)
		if err != nil {
			return err
		}
		if verdict == longhorn.DataOnlyThere || verdict == longhorn.DataStale && !fs.Accepted {
			return fmt.Errorf("the copies of service %s changed since kip examined them (without %s its data is now %s), so kip does not taint %s: "+
				"run kip node fence %s again, which decides again what happens to each service", fs.Ref, name, verdict, name, name)
		}
	}
	n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", name, err)
	}
	if readyCondition(n) == corev1.ConditionTrue {
		return fmt.Errorf("worker %s reports Ready again, so kip does not taint it: the services the fence stopped stay stopped as recorded; "+
			"rejoin it with kip node add %s, which starts them again, or run kip node fence %s again once it has stopped reporting for a minute", name, f.worker.Host, name)
	}
	if f.node == nil {
		return f.kubeletGone(ctx)
	}
	res, err := f.node.Probe(ctx, k3s.FencedCommand())
	if err != nil {
		return err
	}
	if res.ExitStatus != 0 {
		return fmt.Errorf("the fence no longer holds %s stopped (%s), so kip does not taint it: run kip node fence %s again",
			name, strings.ReplaceAll(strings.TrimSpace(string(res.Stdout)), "\n", "; "), name)
	}
	return nil
}

// podsStep deletes, a minute after the taint, the Kipper pods with Longhorn volumes still on
// the node: each only while the node is still NotReady and tainted and its volumes' attachments
// to the node are gone.
func (f *fencer) podsStep() workflow.Step {
	name := f.o.Worker
	return workflow.Step{
		Name: "pods", Title: "Delete the Kipper pods left on " + name,
		Done: "No Kipper pod with a Longhorn volume is left on " + name, Already: "No Kipper pod with a Longhorn volume is left on " + name,
		Check: func(ctx context.Context) (bool, error) {
			left, err := kipperPodsOn(ctx, f.cl, name)
			return len(left) == 0, err
		},
		Apply: func(ctx context.Context) error {
			n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if at := taintAdded(n); at != nil {
				select {
				case <-time.After(time.Until(at.Add(fenceSettle))):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return kube.Poll(ctx, fencePodsTimeout, "the Kipper pods on "+name+" deleted", func(ctx context.Context) (bool, string, error) {
				return f.deleteLeft(ctx)
			})
		},
	}
}

// deleteLeft deletes the Kipper pods left on the fenced node whose volumes are detached from it,
// while the node is still NotReady and tainted; it reports whether none is left.
func (f *fencer) deleteLeft(ctx context.Context) (bool, string, error) {
	name := f.o.Worker
	n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("read node %s: %w", name, err)
	}
	if !hasTaint(n, cluster.OutOfServiceTaint) || readyCondition(n) == corev1.ConditionTrue {
		return false, "", fmt.Errorf("node %s is no longer NotReady and tainted out of service, so kip deletes none of its pods: see 'kip node list'", name)
	}
	left, err := kipperPodsOn(ctx, f.cl, name)
	if err != nil || len(left) == 0 {
		return err == nil, "", err
	}
	attached, err := attachedTo(ctx, f.cl, name)
	if err != nil {
		return false, "", err
	}
	var waiting []string
	for _, lp := range left {
		if slices.ContainsFunc(lp.volumes, func(pv string) bool { return slices.Contains(attached, pv) }) {
			waiting = append(waiting, lp.pod.Namespace+"/"+lp.pod.Name+" (its volume is still attached to "+name+")")
			continue
		}
		err := f.cl.Kube.CoreV1().Pods(lp.pod.Namespace).Delete(ctx, lp.pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0),
			Preconditions: &metav1.Preconditions{UID: &lp.pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, "", fmt.Errorf("delete pod %s/%s: %w", lp.pod.Namespace, lp.pod.Name, err)
		}
		f.p.Info("Deleted pod " + lp.pod.Namespace + "/" + lp.pod.Name + " left on fenced " + name)
	}
	return len(waiting) == 0, strings.Join(waiting, "; "), nil
}

// leftPod is a Kipper pod on the fenced node, with the Longhorn volumes (PV names) it mounts.
type leftPod struct {
	pod     corev1.Pod
	volumes []string
}

// kipperPodsOn are the pods of Kipper projects' namespaces on node that mount a Longhorn volume.
func kipperPodsOn(ctx context.Context, cl *kube.Clients, node string) ([]leftPod, error) {
	nss, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: service.ProjectLabel})
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var out []leftPod
	for _, ns := range nss.Items {
		pods, err := cl.Kube.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return nil, fmt.Errorf("list the pods of %s on %s: %w", ns.Name, node, err)
		}
		for _, p := range pods.Items {
			lp := leftPod{pod: p}
			for _, v := range p.Spec.Volumes {
				if v.PersistentVolumeClaim == nil {
					continue
				}
				pvc, err := cl.Kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
				if apierrors.IsNotFound(err) || err == nil && pvc.Spec.VolumeName == "" {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("read claim %s/%s: %w", p.Namespace, v.PersistentVolumeClaim.ClaimName, err)
				}
				pv, err := cl.Kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
				if err == nil && longhorn.VolumeName(pv) != "" {
					lp.volumes = append(lp.volumes, pv.Name)
				} else if err != nil && !apierrors.IsNotFound(err) {
					return nil, fmt.Errorf("read volume %s: %w", pvc.Spec.VolumeName, err)
				}
			}
			if len(lp.volumes) > 0 {
				out = append(out, lp)
			}
		}
	}
	return out, nil
}

// taintAdded is when the out-of-service taint was put on n, nil when it is not there or its time
// is not known.
func taintAdded(n *corev1.Node) *time.Time {
	for _, t := range n.Spec.Taints {
		if t.Key == cluster.OutOfServiceTaint && t.TimeAdded != nil {
			return &t.TimeAdded.Time
		}
	}
	return nil
}

// readyCondition is the status of n's Ready condition, Unknown when it has none.
func readyCondition(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// report says, once the fence holds, where each service runs again and which stay stopped and
// why, then warns about the other pods with single-node volumes there.
func (f *fencer) report(ctx context.Context) {
	name := f.o.Worker
	f.p.Success("Fenced worker " + name + ": it stays out of service until kip node add " + f.worker.Host + " rejoins it, or kip node remove " + name + " --force gives it up")
	for _, fs := range f.intent.Services {
		if fs.stays() {
			f.p.Warn(fmt.Sprintf("Service %s stays stopped: %s", fs.Ref, f.staysWhy(ctx, fs)))
			continue
		}
		where, err := runsOn(ctx, f.cl, fs.Ref, name)
		switch {
		case err != nil:
			f.p.Warn(fmt.Sprintf("Service %s should start on another node (%s), but: %v; 'kip service info %s' shows where it runs", fs.Ref, fs.where(), err, fs.Flags()))
		default:
			f.p.Info(fmt.Sprintf("Service %s runs again on %s (%s)", fs.Ref, where, fs.where()))
		}
	}
	for _, j := range f.intent.Jobs {
		f.p.Info("Job " + j + " is suspended while " + name + " is fenced: its pods held single-node volumes there")
	}
	for _, o := range f.intent.Others {
		f.p.Warn("Pod " + o + " is no Kipper workload and holds a single-node volume on " + name +
			": kip did not check its copies, and Kubernetes starts it on whichever copy Longhorn has available")
	}
}

// staysWhy says why a service the fence stopped stays stopped, and how it comes back.
func (f *fencer) staysWhy(ctx context.Context, fs fencedService) string {
	back := fmt.Sprintf("%s; rejoin %s with kip node add %s", fs.Why, f.o.Worker, f.worker.Host)
	if fs.Data == longhorn.DataStale {
		return back + ", or start it on the older copies with kip service start " + fs.Flags() + " --accept-stale-data"
	}
	s, err := service.Get(ctx, f.cl.Dynamic, fs.Ref)
	if err != nil {
		return back
	}
	return service.OnlyThereRecipe(s, f.o.Worker, f.worker.Host)
}

// runsOn waits until the service's pod is Ready on a node other than gone, and names that node.
func runsOn(ctx context.Context, cl *kube.Clients, ref service.Ref, gone string) (string, error) {
	var where string
	err := kube.Poll(ctx, fenceStartTimeout, "service "+ref.String()+" Ready on another node", func(ctx context.Context) (bool, string, error) {
		s, err := service.Get(ctx, cl.Dynamic, ref)
		if err != nil {
			return false, "", err
		}
		pods, err := service.Pods(ctx, cl.Kube, s)
		if err != nil {
			return false, "", err
		}
		for _, p := range pods {
			if p.Spec.NodeName != "" && p.Spec.NodeName != gone && p.DeletionTimestamp == nil && podutils.IsPodReady(&p) {
				where = p.Spec.NodeName
				return true, "", nil
			}
		}
		return false, "its pod is not Ready on another node yet", nil
	})
	return where, err
}
