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

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
)

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
		d, err := service.DecideStart(ctx, f.cl, s, name, f.intent.CutOff, fs.Accepted, nil)
		if err != nil {
			return err
		}
		if !d.Starts() {
			return fmt.Errorf("the copies of service %s changed since kip examined them (without %s its data is now %s), so kip does not taint %s: "+
				"run kip node fence %s again, which decides again what happens to each service", fs.Ref, name, d.Verdict, name, name)
		}
	}
	n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", name, err)
	}
	if readyCondition(n) == corev1.ConditionTrue {
		return fmt.Errorf("worker %s reports Ready again, so kip does not taint it: the services the fence stopped stay stopped as recorded; "+
			"rejoin it with %s, which starts them again, or run kip node fence %s again once it has stopped reporting for a minute", name, service.RejoinCommand(f.worker.Host), name)
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
	f.p.Success("Fenced worker " + name + ": it stays out of service until " + service.RejoinCommand(f.worker.Host) + " rejoins it, or kip node remove " + name + " --force gives it up")
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
	back := fmt.Sprintf("%s; rejoin %s with %s", fs.Why, f.o.Worker, service.RejoinCommand(f.worker.Host))
	if fs.Data == longhorn.DataStale {
		return back + ", or start it on the older copies with " + service.AcceptStaleCommand(fs.Ref)
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
