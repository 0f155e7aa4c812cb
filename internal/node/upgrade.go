package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
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

// UpgradeOptions are what the k3s upgrades of the nodes need from kip install or kip upgrade.
type UpgradeOptions struct {
	Kube *kube.Clients
	// Dial connects to a node's host over SSH with the cluster's SSH settings.
	Dial func(ctx context.Context, host string) (*sshx.Client, error)
	// Version is the release every node moves to; Pinned its pinned SHA-256 ("" when this kip
	// pins another release).
	Version, Pinned string
	// AirgapBundle is --airgap-bundle, "" to download the binary on each host.
	AirgapBundle string
	// Nodes is the record the plan was made from.
	Nodes cluster.Nodes
	// Again is the command that goes on after a failed step, e.g. kip upgrade --k3s.
	Again string
}

// UpgradeSteps are one step per worker of the plan: it reruns the k3s install on the worker at
// o.Version with its saved join settings and restarts k3s-agent (running pods keep running: no
// drain), then waits up to 5 minutes for its node to report Ready on that release. A worker
// already Ready on it is skipped.
func UpgradeSteps(o UpgradeOptions, plan WorkerPlan) []workflow.Step {
	var steps []workflow.Step
	for _, name := range plan.Upgrade {
		w := o.Nodes.Workers[name]
		u := &nodeUpgrade{o: o, name: name, host: w.Host, unit: k3s.AgentUnit, what: "worker " + name,
			rejoin: "rejoin it with 'kip node add " + w.Host + "' (its original options)",
			checkMachine: func(ctx context.Context, c *sshx.Client, n *corev1.Node) (string, error) {
				return checkWorkerMachine(ctx, c, name, w, n)
			}}
		steps = append(steps, u.step("k3s-"+name))
	}
	return steps
}

// ServerUpgradeStep moves the server's k3s (its node is name, its host reached at host) to
// o.Version: the k3s install for that release, a restart of k3s, then up to 5 minutes for its
// node to report Ready on the release. Restarting k3s pauses the API; running pods keep
// serving. A server whose node already reports Ready on the release keeps running; one whose
// binary an interrupted attempt already replaced is restarted.
func ServerUpgradeStep(o UpgradeOptions, name, host string) workflow.Step {
	u := &nodeUpgrade{o: o, name: name, host: host, unit: k3s.ServerUnit, what: "the server",
		rejoin: "put back the release its node reports, or re-run kip install on it",
		checkMachine: func(ctx context.Context, c *sshx.Client, n *corev1.Node) (string, error) {
			id, err := serverIdentity(ctx, c, name, n, host)
			return id.Arch, err
		}}
	return u.step("k3s-server")
}

// serverIdentity reads what the host at host (reached by c) says it is, and refuses it unless it
// is the machine of the server's node name (n; nil when the API has none).
func serverIdentity(ctx context.Context, c *sshx.Client, name string, n *corev1.Node, host string) (hostIdentity, error) {
	id, err := readIdentity(ctx, c)
	if err != nil {
		return id, err
	}
	if other := id.otherMachine(name, n); other != "" {
		return id, fmt.Errorf("the host at %s is not the server (%s): kip leaves it alone; check the server address saved for this cluster", host, other)
	}
	return id, nil
}

// ServerConfig reads the k3s configuration file (config.yaml; nil when there is none) of the
// host at host, reached by c, in the round trip that makes sure it is the machine of the
// server's node n.
func ServerConfig(ctx context.Context, c *sshx.Client, n *corev1.Node, host string) ([]byte, error) {
	id, err := serverIdentity(ctx, c, n.Name, n, host)
	return id.Config, err
}

// nodeUpgrade moves one node's k3s: the server's or a worker's.
type nodeUpgrade struct {
	o UpgradeOptions
	// name is the node's, host where kip reaches it, unit its k3s service.
	name, host, unit string
	// what names the node in messages; rejoin says how to recover a host whose k3s something
	// other than kip changed.
	what, rejoin string
	// checkMachine refuses a host that is not the node, and returns its architecture.
	checkMachine func(ctx context.Context, c *sshx.Client, n *corev1.Node) (string, error)
}

func (u *nodeUpgrade) step(name string) workflow.Step {
	v := u.o.Version
	return workflow.Step{
		Name: name, Title: "Bring k3s on " + u.what + " to " + v,
		Done: cap1(u.what) + " is Ready on k3s " + v, Already: cap1(u.what) + " already Ready on k3s " + v,
		Check: func(ctx context.Context) (bool, error) {
			ok, _, err := u.readyOnRelease(ctx)
			return ok, err
		},
		Plan: func(context.Context) ([]string, error) {
			return []string{"install k3s " + v + " on " + u.host + " and restart " + u.unit}, nil
		},
		Apply: u.apply,
	}
}

// cap1 capitalises the first letter of s.
func cap1(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

// readyOnRelease reports whether the node is Ready on the target release, and what it reports
// otherwise.
func (u *nodeUpgrade) readyOnRelease(ctx context.Context) (bool, string, error) {
	n, err := u.o.Kube.Kube.CoreV1().Nodes().Get(ctx, u.name, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("read node %s: %w", u.name, err)
	}
	v, st := n.Status.NodeInfo.KubeletVersion, cluster.NodeStatus(n)
	return st == cluster.NodeReady && v == u.o.Version, st + " on k3s " + v, nil
}

func (u *nodeUpgrade) apply(ctx context.Context) error {
	c, err := u.o.Dial(ctx, u.host)
	if err != nil {
		return fmt.Errorf("reach %s at %s over SSH: %w", u.what, u.host, err)
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
		return fmt.Errorf("read k3s's release on %s (%s --version): %w", u.what, k3s.BinaryPath, err)
	}
	if installed != reported && installed != u.o.Version {
		return fmt.Errorf("%s has k3s %q installed, but its node reports %s and kip moves it to %s: something other than kip changed it; %s",
			cap1(u.what), installed, reported, u.o.Version, u.rejoin)
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
			return fmt.Errorf("install k3s %s on %s: %w", u.o.Version, u.what, err)
		}
	}
	// The unit and the settings (configuration, a worker's join token) stay as kip wrote them:
	// k3s starts again on the new binary with them.
	if _, err := c.Output(ctx, sshx.Command("systemctl", "restart", u.unit)); err != nil {
		return fmt.Errorf("restart %s on %s: %w", u.unit, u.what, err)
	}
	err = kube.Poll(ctx, upgradeTimeout, "node "+u.name+" Ready on k3s "+u.o.Version, func(ctx context.Context) (bool, string, error) {
		ok, pending, err := u.readyOnRelease(ctx)
		switch {
		case err != nil && u.unit == k3s.ServerUnit:
			// The server's restart takes the API away, and it may refuse kip's credentials for
			// a while as it comes back: pending until the timeout.
			return false, err.Error(), nil
		case err != nil:
			pending, err = kube.PendingGet("node "+u.name, errors.Unwrap(err))
		}
		return ok, pending, err
	})
	if err != nil {
		again := ""
		if u.o.Again != "" {
			again = "; then run " + u.o.Again + " again"
		}
		return fmt.Errorf("%w (see 'journalctl -u %s' on %s%s)", err, u.unit, u.host, again)
	}
	return nil
}

// checkWorkerMachine refuses a host that is not the worker kip joined there (checkIdentity), or
// one without its k3s configuration. It returns the host's architecture, for the binary.
func checkWorkerMachine(ctx context.Context, c *sshx.Client, name string, w cluster.Worker, n *corev1.Node) (string, error) {
	id, err := readIdentity(ctx, c)
	if err != nil {
		return "", err
	}
	if err := checkIdentity(id, name, w, n); err != nil {
		return "", fmt.Errorf("%w, or rejoin it with 'kip node add %s'", err, w.Host)
	}
	if !id.Configured {
		return "", fmt.Errorf("worker %s at %s has no k3s configuration (%s): rejoin it with 'kip node add %s'", name, w.Host, k3s.ConfigPath, w.Host)
	}
	return id.Arch, nil
}
