package install

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/node"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/verify"
	"kipper.run/kip/internal/workflow"
)

// Timeouts of the cluster steps.
const (
	nodeReadyTimeout = 5 * time.Minute
	componentTimeout = 10 * time.Minute
	verifyTimeout    = 5 * time.Minute
	pollInterval     = 500 * time.Millisecond
)

// clusterIntent is what the cluster workflow decided, kept in its progress record so that a
// resumed run verifies with the same run ID.
type clusterIntent struct {
	VerifyID string `json:"verifyID"`
}

// runHost runs the host workflow: it keeps no record (there may be no cluster yet) and resumes
// by its checks alone.
func (in *installer) runHost(ctx context.Context) error {
	steps, err := in.hostSteps()
	if err != nil {
		return err
	}
	r := &workflow.Runner{Report: in.p, KipVersion: buildinfo.Version, DryRun: in.o.DryRun, Held: in.lock}
	return r.Run(ctx, &workflow.Workflow{Name: "install-host", Steps: steps})
}

// runCluster runs the cluster workflow under the cluster lock, recording its progress.
func (in *installer) runCluster(ctx context.Context) error {
	steps, intent, err := in.clusterSteps(ctx)
	if err != nil {
		return err
	}
	if err := in.clusterRunner().Run(ctx, &workflow.Workflow{Name: "install", Intent: intent, Steps: steps}); err != nil {
		return fmt.Errorf("install on %s: %w", in.o.Host, err)
	}
	return nil
}

// clusterRunner runs a workflow on the cluster under the cluster lock, recording its progress.
func (in *installer) clusterRunner() *workflow.Runner {
	r := workflow.OnCluster(in.clients, in.env.CommandLine, buildinfo.Version, in.p)
	r.Held = in.lock
	return r
}

// planWorkers decides, before the server's k3s moves, what happens to the recorded workers
// (node.PlanWorkerUpgrades).
func (in *installer) planWorkers(ctx context.Context) error {
	if len(in.nodes.Workers) == 0 {
		return nil
	}
	list, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the nodes: %w", err)
	}
	in.workers, err = node.PlanWorkerUpgrades(in.nodes, list.Items, in.state.k3sVersion, in.move.To)
	return err
}

// sayWorkers says what the worker upgrades will do.
func (in *installer) sayWorkers() {
	if len(in.workers.Upgrade) > 0 {
		in.p.Info(fmt.Sprintf("Workers: k3s %s on %s after the server, one at a time, without a drain", in.move.To, strings.Join(in.workers.Upgrade, ", ")))
	}
	for _, name := range slices.Sorted(maps.Keys(in.workers.Leave)) {
		in.p.Info(fmt.Sprintf("Worker %s: left as it is (%s)", name, in.workers.Leave[name]))
	}
}

// workerSteps bring each planned worker to the server's release.
func (in *installer) workerSteps() []workflow.Step {
	return node.UpgradeSteps(node.UpgradeOptions{
		Kube: in.clients, Version: in.move.To, Pinned: in.binary.Pinned, AirgapBundle: in.o.AirgapBundle, Nodes: in.nodes,
		Dial: func(ctx context.Context, host string) (*sshx.Client, error) {
			cfg, err := in.env.SSHConfig(host, in.saved)
			if err != nil {
				return nil, err
			}
			return in.env.Dial(ctx, cfg)
		},
	}, in.workers)
}

// runWorkers upgrades the workers' k3s, one at a time in name order, under the cluster lock; it
// stops at the first that fails, and the same command run again goes on from there.
func (in *installer) runWorkers(ctx context.Context) error {
	steps := in.workerSteps()
	if len(steps) == 0 {
		return nil
	}
	if err := in.clusterRunner().Run(ctx, &workflow.Workflow{Name: "install-workers", Steps: steps}); err != nil {
		return fmt.Errorf("k3s on the workers: %w; the server is upgraded: run the same command again to go on with the workers", err)
	}
	return nil
}

// plan is a dry run: the host steps say what they would change, and so do the cluster steps
// when the cluster exists; on a fresh host they are listed as they would run.
func (in *installer) plan(ctx context.Context) error {
	steps, err := in.hostSteps()
	if err != nil {
		return err
	}
	cs, _, err := in.clusterSteps(ctx)
	if err != nil {
		return err
	}
	if in.clients == nil {
		// No cluster yet: every cluster step would run, as it is titled.
		for i := range cs {
			cs[i].Check, cs[i].Plan = func(context.Context) (bool, error) { return false, nil }, nil
		}
	}
	steps = append(steps, cs...)
	if in.clients != nil {
		steps = append(steps, in.workerSteps()...)
	}
	r := &workflow.Runner{Report: in.p, DryRun: true}
	if in.clients != nil {
		r.Dynamic = in.clients.Dynamic
	}
	return r.Run(ctx, &workflow.Workflow{Name: "install", Steps: steps})
}

// componentOptions renders the components for this cluster, with what settle decided.
func (in *installer) componentOptions(ctx context.Context) (components.Options, error) {
	mon := cluster.Monitoring{Prometheus: in.sizing.Profile.Monitoring, Loki: in.sizing.Profile.Monitoring}
	if in.rerun {
		mon = in.record.Monitoring
	}
	o := components.Options{
		Sizing: in.sizing, Monitoring: mon, AdminEmail: in.adminEmail, ServerAddress: in.address,
		Backups: in.backups, Pinned: in.pinned, KipVersion: buildinfo.Version,
	}
	if in.clients != nil {
		dex, err := components.ReadDexConfig(ctx, in.clients)
		if err != nil {
			return o, err
		}
		o.ExistingDexConfig = dex
		// A re-run keeps the Longhorn release the cluster runs: kip upgrade --longhorn moves it.
		release, err := components.ReadRelease(ctx, in.clients, "longhorn")
		if err != nil {
			return o, err
		}
		o.Kept = map[string]string{"longhorn": release}
	}
	return o, nil
}

// clusterSteps are the steps on the cluster: the server's node Ready, each component, the
// cluster record, and the verification pods.
func (in *installer) clusterSteps(ctx context.Context) ([]workflow.Step, *clusterIntent, error) {
	o, err := in.componentOptions(ctx)
	if err != nil {
		return nil, nil, err
	}
	comps, err := components.Render(o)
	if err != nil {
		return nil, nil, err
	}
	intent := &clusterIntent{VerifyID: rand.String(5)}
	steps := []workflow.Step{{
		Name: "node-ready", Title: "Wait for the server's node to be Ready",
		Done: "The server's node is Ready", Already: "The server's node is Ready",
		Check: func(ctx context.Context) (bool, error) {
			pending, err := in.serverNodePending(ctx)
			return pending == "", err
		},
		Apply: func(ctx context.Context) error {
			return kube.PollPending(ctx, nodeReadyTimeout, "the server's node to be Ready", in.serverNodePending)
		},
	}}
	for _, c := range comps {
		steps = append(steps, components.Step(in.clients, c))
	}
	if in.sizing.Storage == cluster.StorageLonghorn {
		steps = append(steps, longhorn.PlacementStep(in.clients))
	}
	rec := in.intendedRecord(o, comps)
	steps = append(steps, workflow.Step{
		Name: "cluster-record", Title: "Record the cluster",
		Done: "Recorded the cluster (" + kube.RecordPrefix + cluster.RecordName + ")", Already: "The cluster's record is up to date",
		Check: func(ctx context.Context) (bool, error) {
			have, found, err := cluster.ReadRecord(ctx, in.clients.Dynamic)
			return found && have.Same(rec), err
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateRecord(ctx, in.clients.Dynamic, func(r *cluster.Record, found bool) error {
				installed, offer := r.InstalledAt, r.MaxCopies
				*r = rec
				r.MaxCopies = offer
				if found && !installed.IsZero() {
					r.InstalledAt = installed
				}
				return nil
			})
			return err
		},
	}, in.verifyStep(intent), in.finishStep())
	return steps, intent, nil
}

// intendedRecord is the cluster record this run writes.
func (in *installer) intendedRecord(o components.Options, comps []components.Component) cluster.Record {
	versions := map[string]string{}
	for _, c := range in.pinned.Components {
		versions[c.Name] = c.Version
	}
	versions["k3s"] = in.move.To
	for _, c := range comps {
		if c.Version != "" {
			versions[c.Name] = c.Version
		}
	}
	backups, location := components.BackupsOf(o)
	return cluster.Record{
		Profile: in.sizing.Profile.Name, Storage: in.sizing.Storage, Network: in.network, Server: in.address,
		KipVersion: buildinfo.Version, Versions: versions, Monitoring: o.Monitoring,
		Backups: backups, BackupLocation: location, AdminEmail: o.AdminEmail,
		InstalledAt: time.Now().UTC(),
	}
}

// serverNodePending says why the server's node (the one with the server's address) is not
// Ready yet, or "" when it is.
func (in *installer) serverNodePending(ctx context.Context) (string, error) {
	nodes, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if !slices.ContainsFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Address == in.nodeIP }) {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return "", nil
			}
		}
		return "node " + n.Name + " is not Ready", nil
	}
	return "no node with address " + in.nodeIP + " has registered", nil
}

// verifyStep runs a verification Job on every Ready node (see package verify). A node that is
// not Ready, a worker that is down, is left out and named: it could not run the Job, and the
// worker upgrades after the cluster steps, or kip node add, look after it. A verification that
// failed (in an earlier run of the same install) is not done: it runs again, the failed Job
// replaced.
func (in *installer) verifyStep(intent *clusterIntent) workflow.Step {
	return workflow.Step{
		Name: "verify-nodes", Title: "Verify DNS and Service routing from every Ready node",
		Done: "DNS and Service routing work on every Ready node", Already: "Every Ready node already verified",
		Check: func(ctx context.Context) (bool, error) {
			ready, _, err := in.readyNodes(ctx)
			if err != nil {
				return false, err
			}
			return verify.Passed(ctx, in.clients.Kube, intent.VerifyID, ready)
		},
		Apply: func(ctx context.Context) error {
			ready, down, err := in.readyNodes(ctx)
			if err != nil {
				return err
			}
			for _, n := range down {
				in.p.Warn("Node " + n + " is not Ready: not verified")
			}
			return verify.Run(ctx, in.clients.Kube, intent.VerifyID, ready, verifyTimeout)
		},
	}
}

// readyNodes are the names of the cluster's Ready nodes, and of the others.
func (in *installer) readyNodes(ctx context.Context) (ready, down []string, err error) {
	list, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	ready = []string{}
	for i := range list.Items {
		if n := &list.Items[i]; cluster.NodeStatus(n) == cluster.NodeReady {
			ready = append(ready, n.Name)
		} else {
			down = append(down, n.Name)
		}
	}
	return ready, down, nil
}
