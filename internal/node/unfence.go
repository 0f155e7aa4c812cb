package node

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// The rejoin of a fenced worker lifts its fence step by step around the usual join: the host
// rebooted unless it booted since the fence (so nothing from before the fence still runs or is
// mounted there), the drop-in removed before k3s-agent starts, the out-of-service taint lifted
// before kip waits for the node to be Ready, and, once the worker is recorded ready, the services
// the fence stopped started (older data only with consent) and the fence forgotten.

// unfenceRebootStep reboots the host when it still runs the boot it was fenced on.
func (j *joiner) unfenceRebootStep() workflow.Step {
	name, fenced := j.intent.Node, j.fenced
	booted := func(ctx context.Context) (bool, string, error) {
		boot, err := j.node.Query(ctx, bootIDCommand)
		if err != nil {
			return false, "", err
		}
		id := strings.TrimSpace(string(boot))
		return fenced.BootID == "" || id != fenced.BootID, id, nil
	}
	return workflow.Step{
		Name: "unfence-reboot", Title: "Reboot " + name + ", which has not booted since its fence",
		Done: "Rebooted " + name, Already: name + " booted since its fence",
		Check: func(ctx context.Context) (bool, error) {
			done, _, err := booted(ctx)
			return done, err
		},
		Apply: func(ctx context.Context) error {
			res, err := j.node.Run(ctx, sshx.Command("systemctl", "--no-block", "reboot"))
			if err == nil && res.ExitStatus != 0 {
				return fmt.Errorf("systemctl reboot on %s: exit status %d: %s", name, res.ExitStatus, strings.TrimSpace(string(res.Stderr)))
			}
			// While the host reboots, SSH fails: that is waiting, not an error.
			return kube.Poll(ctx, rebootTimeout, name+" booted again", func(ctx context.Context) (bool, string, error) {
				done, _, err := booted(ctx)
				if err != nil {
					return false, err.Error(), nil
				}
				return done, "still on the boot it was fenced on", nil
			})
		},
	}
}

// unfenceAgentStep removes the fence's drop-in, so that the join can start k3s-agent.
func (j *joiner) unfenceAgentStep() workflow.Step {
	name := j.intent.Node
	return workflow.Step{
		Name: "unfence-agent", Title: "Let k3s-agent start on " + name + " again (remove " + k3s.FenceDropIn + ")",
		Done: "k3s-agent may start on " + name + " again", Already: "No fence keeps k3s-agent from starting on " + name,
		Check: func(ctx context.Context) (bool, error) {
			res, err := j.node.Probe(ctx, sshx.Command("test", "!", "-e", k3s.FenceDropIn))
			return err == nil && res.ExitStatus == 0, err
		},
		Apply: func(ctx context.Context) error {
			if _, err := j.node.Output(ctx, k3s.UnfenceAgentCommand()); err != nil {
				return fmt.Errorf("remove the fence's drop-in on %s: %w", name, err)
			}
			return nil
		},
	}
}

// unfenceTaintStep lifts the out-of-service taint, so that the node can count as Ready again; its
// cordon (the hold step) keeps ordinary workloads off until the checks pass.
func (j *joiner) unfenceTaintStep() workflow.Step {
	name := j.intent.Node
	return workflow.Step{
		Name: "unfence-taint", Title: "Lift the out-of-service taint from " + name,
		Done: "Lifted the out-of-service taint from " + name, Already: name + " is not tainted out of service",
		Check: func(ctx context.Context) (bool, error) {
			n, err := j.nodeNow(ctx)
			return err == nil && (n == nil || !hasTaint(n, cluster.OutOfServiceTaint)), err
		},
		Apply: func(ctx context.Context) error {
			err := updateNode(ctx, j.cl, name, func(n *corev1.Node) bool {
				if !hasTaint(n, cluster.OutOfServiceTaint) {
					return false
				}
				n.Spec.Taints = withoutTaint(n.Spec.Taints, cluster.OutOfServiceTaint)
				return true
			})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("lift the out-of-service taint from %s: %w", name, err)
			}
			return nil
		},
	}
}

// unfenceStep starts the services the fence stopped that may start (their copies current, or
// older ones accepted on a terminal), suspended Jobs resumed, and forgets the fence. A service
// that may not start keeps the fence's mark, and kip service start starts it later.
func (j *joiner) unfenceStep() workflow.Step {
	name := j.intent.Node
	return workflow.Step{
		Name: "unfence", Title: "Start the services the fence of " + name + " stopped, and forget the fence",
		Done: "Lifted the fence of " + name, Already: name + " is not fenced",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
			return n.Workers[name].Fence == nil, err
		},
		Apply: func(ctx context.Context) error {
			for _, st := range j.fenced.Stopped {
				ref := stoppedRef(st)
				s, err := service.Get(ctx, j.cl.Dynamic, ref)
				if err != nil {
					j.p.Warn(fmt.Sprintf("Service %s, which the fence stopped: %v", ref, err))
					continue
				}
				if s.FenceStop != name {
					continue // started meanwhile with kip service start
				}
				d, err := service.DecideStart(ctx, j.cl, s, "", nil, false, j.o.Prompter.Consent)
				if err != nil {
					return err
				}
				if why := d.StartWhy(s, "", j.o.Host); why != "" {
					j.p.Warn(fmt.Sprintf("Service %s stays stopped: %s", s.Ref, why))
					continue
				}
				if err := service.LiftFenceStop(ctx, j.cl.Dynamic, s.Ref); err != nil {
					return err
				}
				j.p.Info("Started service " + s.Ref.String() + ", which the fence stopped")
			}
			for _, job := range j.fenced.Suspended {
				ns, jn, _ := strings.Cut(job, "/")
				_, err := j.cl.Kube.BatchV1().Jobs(ns).Patch(ctx, jn, types.MergePatchType, []byte(`{"spec":{"suspend":false}}`), metav1.PatchOptions{FieldManager: kube.FieldManager})
				if err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("resume Job %s: %w", job, err)
				}
			}
			return cluster.UpdateWorker(ctx, j.cl.Dynamic, name, func(w *cluster.Worker) { w.Fence = nil })
		},
	}
}
