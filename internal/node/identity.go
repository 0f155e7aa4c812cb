package node

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/sshx"
)

// hostIdentity is what the host at a worker's recorded address says it is.
type hostIdentity struct {
	Hostname  string
	MachineID string
	BootID    string
	Arch      string
	// NodeName and NodeIP are what its k3s configuration registers; Configured is false when
	// it has none (a host a remove wiped).
	NodeName   string
	NodeIP     string
	Configured bool
	// Config is its k3s configuration file as it is.
	Config []byte
}

// identityScript prints the host's name, machine ID (an empty line without /etc/machine-id),
// boot ID and architecture, one per line, then its k3s configuration when it has one.
var identityScript = "hostname && { cat /etc/machine-id 2>/dev/null || echo; } && cat /proc/sys/kernel/random/boot_id && uname -m && " +
	"if " + sshx.Command("test", "-e", k3s.ConfigPath) + "; then " + sshx.Command("cat", k3s.ConfigPath) + "; fi"

// readIdentity reads what the host c reaches says it is (a query: it changes nothing).
func readIdentity(ctx context.Context, c *sshx.Client) (hostIdentity, error) {
	out, err := c.Query(ctx, identityScript)
	if err != nil {
		return hostIdentity{}, fmt.Errorf("read the name, machine ID and k3s configuration of the host at %s: %w", c, err)
	}
	lines := strings.SplitN(string(out), "\n", 5)
	if len(lines) < 4 {
		return hostIdentity{}, fmt.Errorf("the host at %s printed %q for its name, machine ID, boot ID and architecture", c, out)
	}
	id := hostIdentity{Hostname: strings.TrimSpace(lines[0]), MachineID: strings.TrimSpace(lines[1]),
		BootID: strings.TrimSpace(lines[2]), Arch: strings.TrimSpace(lines[3])}
	if len(lines) == 5 && strings.TrimSpace(lines[4]) != "" {
		id.Config = []byte(lines[4])
		var cfg struct {
			NodeName string `json:"node-name"`
			NodeIP   string `json:"node-ip"`
		}
		if err := yaml.Unmarshal([]byte(lines[4]), &cfg); err != nil {
			return id, fmt.Errorf("the host at %s: read %s: %w", c, k3s.ConfigPath, err)
		}
		id.NodeName, id.NodeIP, id.Configured = cfg.NodeName, cfg.NodeIP, true
	}
	return id, nil
}

// checkIdentity refuses a host that is not worker name as kip recorded it (w) and as its node
// (n, nil when the API has none) reports it: its name must be the node's, its machine ID the one
// the node's kubelet reported, and its k3s configuration, when it has one, must register that
// node at the recorded address. An address that moved to another machine must not get that
// machine stopped, wiped or rebooted.
// otherMachine says how the host differs from the machine node name (n) reported, "" when it is
// that machine (or n reported none).
func (id hostIdentity) otherMachine(name string, n *corev1.Node) string {
	if n == nil || n.Status.NodeInfo.MachineID == "" || id.MachineID == n.Status.NodeInfo.MachineID {
		return ""
	}
	return fmt.Sprintf("its machine ID is %s where node %s reported %s", id.MachineID, name, n.Status.NodeInfo.MachineID)
}

func checkIdentity(id hostIdentity, name string, w cluster.Worker, n *corev1.Node) error {
	var wrong []string
	if id.Hostname != name {
		wrong = append(wrong, fmt.Sprintf("it is named %q", id.Hostname))
	}
	if other := id.otherMachine(name, n); other != "" {
		wrong = append(wrong, other)
	}
	if id.Configured && (id.NodeName != name || id.NodeIP != w.Path.Node.String()) {
		wrong = append(wrong, fmt.Sprintf("its k3s registers node %q at %q, not %s at %s", id.NodeName, id.NodeIP, name, w.Path.Node))
	}
	if len(wrong) == 0 {
		return nil
	}
	return fmt.Errorf("the host at %s is not worker %s (%s): kip leaves it alone; check the address kip recorded for %s (kip node list shows it)",
		w.Host, name, strings.Join(wrong, "; "), name)
}
