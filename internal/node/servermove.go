package node

import (
	"context"
	"fmt"
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

// restartRetryTimeout is how long a failed restart of the server's k3s is given to come up by
// systemd's own restart.
const restartRetryTimeout = 2 * time.Minute

// serverMoveStep moves the server's k3s onto the private network on the first private join: its
// node IP becomes its private address, its public one external, in config.yaml as it is (the
// operator's settings and kip's arguments kept). The change goes through k3s.ConfigChange, as
// install's and the upgrade's: the backup and the pending marker first, so that a join stopped
// anywhere finishes this change on its next run and never takes the new file for the previous
// one; k3s that does not come back on it gets the previous file back.
func (j *joiner) serverMoveStep() workflow.Step {
	want := j.intent.Path.Server.String()
	return workflow.Step{
		Name: "server-network", Title: "Move the server's k3s onto " + j.intent.Path.Network.String() + " (k3s restarts twice: the API pauses for 10 to 30 seconds each time)",
		Done: "The server's k3s runs on " + want, Already: "The server's k3s already runs on " + want,
		Check: func(ctx context.Context) (bool, error) {
			n, err := j.serverNode(ctx)
			if err != nil || !slices.Contains(internalIPs(n), want) || !slices.Contains(nodeInternalIPs(n), want) {
				return false, err
			}
			change, err := j.serverConfigChange(ctx, n)
			if err != nil {
				return false, err
			}
			st, err := change.Read(ctx)
			return err == nil && change.Done(st), err
		},
		Apply: func(ctx context.Context) error {
			n, err := j.serverNode(ctx)
			if err != nil {
				return err
			}
			change, err := j.serverConfigChange(ctx, n)
			if err != nil {
				return err
			}
			st, err := change.Read(ctx)
			if err != nil {
				return err
			}
			if err := change.Write(ctx, st); err != nil {
				return err
			}
			return change.Restart(ctx, st)
		},
	}
}

// serverConfigChange is the change of the server's config.yaml that moves its k3s onto the private
// network, read from the server (the host checked to be the server's node n's machine).
func (j *joiner) serverConfigChange(ctx context.Context, n *corev1.Node) (k3s.ConfigChange, error) {
	config, err := ServerConfig(ctx, j.server, n, j.rec.Server)
	if err != nil {
		return k3s.ConfigChange{}, err
	}
	body, err := k3s.SetNodeAddresses(config, j.intent.Path.Server.String(), j.serverPublic.String())
	if err != nil {
		return k3s.ConfigChange{}, fmt.Errorf("the server's %w", err)
	}
	return k3s.ConfigChange{C: j.server, Files: []k3s.File{{Path: k3s.ConfigPath, Data: body, Mode: 0o600}}, Unit: k3s.ServerUnit, Verb: "restart",
		Again: "the same kip node add", Warn: j.p.Warn,
		Up: func(ctx context.Context, restored bool) error {
			if !restored {
				return j.restartServer(ctx, j.intent.Path.Server.String())
			}
			config, err := j.server.Query(ctx, sshx.Command("cat", k3s.ConfigPath))
			if err != nil {
				return fmt.Errorf("read the server's restored %s: %w", k3s.ConfigPath, err)
			}
			ip, err := k3s.NodeIP(config)
			if err != nil {
				return fmt.Errorf("the server's restored %w", err)
			}
			return j.restartServer(ctx, ip)
		}}, nil
}

// restartServer restarts k3s on the server onto want, the address it is now configured with
// ("" when its configuration names none: k3s chooses), and waits until it runs there
// steadily. k3s publishes the address when it starts, and its cloud controller then moves the
// Node's InternalIP to it, at which kube-proxy, whose node address changed, exits and takes k3s
// down once more. So kip waits for the Node's InternalIP and then restarts k3s a second time,
// on a Node that already shows the address, and waits for its API and the Node Ready again.
func (j *joiner) restartServer(ctx context.Context, want string) error {
	if err := j.restartK3s(ctx); err != nil {
		return err
	}
	if want == "" {
		return j.waitServerReady(ctx)
	}
	// The API goes away meanwhile when kube-proxy takes k3s down: a failed read is waited out.
	err := kube.Poll(ctx, joinTimeout, "the server's node at "+want, func(ctx context.Context) (bool, string, error) {
		n, err := j.serverNode(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		ips := nodeInternalIPs(n)
		return slices.Contains(ips, want), "InternalIP " + strings.Join(ips, ", "), nil
	})
	if err != nil {
		return err
	}
	if err := j.restartK3s(ctx); err != nil {
		return err
	}
	return j.waitServerReady(ctx)
}

// waitServerReady waits for the server's node to report Ready.
func (j *joiner) waitServerReady(ctx context.Context) error {
	return kube.Poll(ctx, joinTimeout, "the server's node Ready", func(ctx context.Context) (bool, string, error) {
		n, err := j.serverNode(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return cluster.NodeStatus(n) == cluster.NodeReady, cluster.NodeStatus(n), nil
	})
}

// restartK3s restarts k3s on the server and waits for its API. k3s can go down once more while
// it starts, when its Node's address moves under its kube-proxy: systemd then fails this restart
// and starts k3s again itself (Restart=always, 5 seconds later), which kip waits for before it
// counts the restart as failed, naming the last lines of k3s's journal.
func (j *joiner) restartK3s(ctx context.Context) error {
	_, err := j.server.Output(ctx, sshx.Command("systemctl", "restart", k3s.ServerUnit))
	if err == nil {
		return kube.WaitReady(ctx, j.cl, j.rec.Server, joinTimeout)
	}
	j.p.Debug(fmt.Sprintf("the restart of k3s failed (%v): waiting for systemd to start it again", err))
	if werr := kube.WaitReady(ctx, j.cl, j.rec.Server, restartRetryTimeout); werr == nil {
		return nil
	}
	journal, jerr := j.server.Query(ctx, sshx.Command("journalctl", "-u", k3s.ServerUnit, "-n", "15", "--no-pager", "-o", "cat"))
	if jerr != nil {
		return fmt.Errorf("restart k3s on the server: %w", err)
	}
	return fmt.Errorf("restart k3s on the server: %w; k3s's journal ends with:\n%s", err, strings.TrimSpace(string(journal)))
}

func (j *joiner) serverNode(ctx context.Context) (*corev1.Node, error) {
	n, err := j.cl.Kube.CoreV1().Nodes().Get(ctx, j.serverAtStart.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the server's node %s: %w", j.serverAtStart.Name, err)
	}
	return n, nil
}

func nodeInternalIPs(n *corev1.Node) []string {
	var s []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			s = append(s, a.Address)
		}
	}
	return s
}

// internalIPs are the addresses a node's k3s runs on: the k3s.io/internal-ip annotation, which
// k3s writes whenever it starts (the Node's InternalIP follows when k3s's cloud controller next
// syncs it), else the InternalIP.
func internalIPs(n *corev1.Node) []string {
	if a := n.Annotations["k3s.io/internal-ip"]; a != "" {
		return strings.Split(a, ",")
	}
	return nodeInternalIPs(n)
}
