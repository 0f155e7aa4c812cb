package node

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// upgradeTimeout is how long kip waits for each worker to report Ready on the server's release.
const upgradeTimeout = 5 * time.Minute

// WorkerPlan is what a kip install re-run does with the recorded workers once the server runs
// its release: the workers to bring to it, in name order, and those it leaves alone.
type WorkerPlan struct {
	Upgrade []string
	// Leave says, by worker, why kip leaves it unchanged.
	Leave map[string]string
}

// PlanWorkerUpgrades decides, before the server's k3s moves from `from` to `to`, what happens to
// the recorded workers (nodes, with the cluster's Node objects in list). It refuses the move
// when a worker runs a newer release than `to` (k3s is never downgraded), or when the move
// would leave a worker that is within the skew limit more than k3s.KubeletSkew minors behind.
// Workers recorded as joining or being removed, and fenced ones, are left alone.
func PlanWorkerUpgrades(nodes cluster.Nodes, list []corev1.Node, from, to string) (WorkerPlan, error) {
	plan := WorkerPlan{Leave: map[string]string{}}
	for _, name := range slices.Sorted(maps.Keys(nodes.Workers)) {
		w := nodes.Workers[name]
		i := slices.IndexFunc(list, func(n corev1.Node) bool { return n.Name == name })
		var reported string
		if i >= 0 {
			reported = list[i].Status.NodeInfo.KubeletVersion
		}
		switch {
		case w.State != cluster.WorkerReady:
			plan.Leave[name] = "recorded as " + w.State
			continue
		case i < 0:
			plan.Leave[name] = "no node of that name in the cluster"
			continue
		case w.Fence != nil || cluster.NodeStatus(&list[i]) == cluster.NodeOutOfService:
			plan.Leave[name] = "fenced"
			continue
		case reported == "":
			plan.Leave[name] = "its node reports no k3s release"
			continue
		}
		newer, err := k3s.Compare(reported, to)
		if err != nil {
			return plan, fmt.Errorf("worker %s: %w", name, err)
		}
		if newer > 0 {
			return plan, fmt.Errorf("worker %s runs k3s %s, newer than %s, which the server will run, and k3s is never downgraded: use a kip release that installs at least %s", name, reported, to, reported)
		}
		if from != "" {
			before, err := k3s.MinorsBehind(reported, from)
			if err != nil {
				return plan, fmt.Errorf("the server's k3s: %w", err)
			}
			after, _ := k3s.MinorsBehind(reported, to)
			if before <= k3s.KubeletSkew && after > k3s.KubeletSkew {
				return plan, fmt.Errorf("worker %s runs k3s %s: moving the server to %s would leave it %d Kubernetes minors behind, beyond the %d the version skew policy allows: bring it to the server's %s first with 'kip node add %s' (its original options), then run this again",
					name, reported, to, after, k3s.KubeletSkew, from, w.Host)
			}
		}
		plan.Upgrade = append(plan.Upgrade, name)
	}
	return plan, nil
}

// UpgradeOptions are what the worker upgrades need from kip install.
type UpgradeOptions struct {
	Kube *kube.Clients
	// Dial connects to a worker over SSH with the cluster's SSH settings.
	Dial func(ctx context.Context, host string) (*sshx.Client, error)
	// Version is the server's k3s release, which every worker moves to; Pinned its pinned
	// SHA-256 ("" when this kip pins another release).
	Version, Pinned string
	// AirgapBundle is install's --airgap-bundle, "" to download on each worker.
	AirgapBundle string
	// Nodes is the record the plan was made from.
	Nodes cluster.Nodes
}

// UpgradeSteps are one step per worker of the plan: it reruns the k3s install on the worker at
// o.Version with its saved join settings and restarts k3s-agent (running pods keep running: no
// drain), then waits up to 5 minutes for its node to report Ready on that release. A worker
// already Ready on it is skipped.
func UpgradeSteps(o UpgradeOptions, plan WorkerPlan) []workflow.Step {
	var steps []workflow.Step
	for _, name := range plan.Upgrade {
		u := &workerUpgrade{o: o, name: name, w: o.Nodes.Workers[name]}
		steps = append(steps, workflow.Step{
			Name: "k3s-" + name, Title: "Bring k3s on worker " + name + " to " + o.Version,
			Done: "Worker " + name + " is Ready on k3s " + o.Version, Already: "Worker " + name + " already Ready on k3s " + o.Version,
			Check: func(ctx context.Context) (bool, error) {
				ok, _, err := u.readyOnRelease(ctx)
				return ok, err
			},
			Plan: func(context.Context) ([]string, error) {
				return []string{"install k3s " + o.Version + " on " + u.w.Host + " and restart " + k3s.AgentUnit}, nil
			},
			Apply: u.apply,
		})
	}
	return steps
}

// workerUpgrade moves one worker's k3s.
type workerUpgrade struct {
	o    UpgradeOptions
	name string
	w    cluster.Worker
}

// readyOnRelease reports whether the worker's node is Ready on the target release, and what it
// reports otherwise.
func (u *workerUpgrade) readyOnRelease(ctx context.Context) (bool, string, error) {
	n, err := u.o.Kube.Kube.CoreV1().Nodes().Get(ctx, u.name, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("read node %s: %w", u.name, err)
	}
	v, st := n.Status.NodeInfo.KubeletVersion, cluster.NodeStatus(n)
	return st == cluster.NodeReady && v == u.o.Version, st + " on k3s " + v, nil
}

func (u *workerUpgrade) apply(ctx context.Context) error {
	c, err := u.o.Dial(ctx, u.w.Host)
	if err != nil {
		return fmt.Errorf("reach worker %s at %s over SSH: %w", u.name, u.w.Host, err)
	}
	defer c.Close()
	n, err := u.o.Kube.Kube.CoreV1().Nodes().Get(ctx, u.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read node %s: %w", u.name, err)
	}
	arch, err := u.checkMachine(ctx, c, n)
	if err != nil {
		return err
	}
	reported := n.Status.NodeInfo.KubeletVersion
	installed, err := k3s.RemoteVersion(ctx, c, k3s.BinaryPath)
	if err != nil {
		return fmt.Errorf("read k3s's release on worker %s (%s --version): %w", u.name, k3s.BinaryPath, err)
	}
	if installed != reported && installed != u.o.Version {
		return fmt.Errorf("worker %s has k3s %q installed, but its node reports %s and kip moves it to %s: something other than kip changed it; rejoin it with 'kip node add %s' (its original options)",
			u.name, installed, reported, u.o.Version, u.w.Host)
	}
	if installed != u.o.Version {
		b := k3s.BinaryInstall{C: c, Version: u.o.Version, Arch: arch, Pinned: u.o.Pinned}
		if u.o.AirgapBundle != "" {
			if b.Bundle, err = k3s.LoadBundle(u.o.AirgapBundle, arch); err != nil {
				return err
			}
			if err := b.CheckPinned(b.Bundle.SHA256); err != nil {
				return err
			}
		}
		if err := b.Install(ctx); err != nil {
			return fmt.Errorf("install k3s %s on worker %s: %w", u.o.Version, u.name, err)
		}
	}
	// The unit and the join settings (configuration, token) stay as kip node add wrote them:
	// the agent starts again on the new binary with them.
	if _, err := c.Output(ctx, sshx.Command("systemctl", "restart", k3s.AgentUnit)); err != nil {
		return fmt.Errorf("restart %s on worker %s: %w", k3s.AgentUnit, u.name, err)
	}
	err = kube.Poll(ctx, upgradeTimeout, "node "+u.name+" Ready on k3s "+u.o.Version, u.readyOnRelease)
	if err != nil {
		return fmt.Errorf("%w (see 'journalctl -u %s' on %s)", err, k3s.AgentUnit, u.w.Host)
	}
	return nil
}

// checkMachine refuses a host that is not the worker kip joined there (checkIdentity), or one
// without its k3s configuration. It returns the host's architecture, for the binary.
func (u *workerUpgrade) checkMachine(ctx context.Context, c *sshx.Client, n *corev1.Node) (string, error) {
	id, err := readIdentity(ctx, c)
	if err != nil {
		return "", err
	}
	if err := checkIdentity(id, u.name, u.w, n); err != nil {
		return "", fmt.Errorf("%w, or rejoin it with 'kip node add %s'", err, u.w.Host)
	}
	if !id.Configured {
		return "", fmt.Errorf("worker %s at %s has no k3s configuration (%s): rejoin it with 'kip node add %s'", u.name, u.w.Host, k3s.ConfigPath, u.w.Host)
	}
	return id.Arch, nil
}
