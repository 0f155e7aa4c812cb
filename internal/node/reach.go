package node

import (
	"context"
	"fmt"
	"slices"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/sshx"
)

// peer is an existing worker, reached over SSH.
type peer struct {
	name     string
	worker   cluster.Worker
	c        *sshx.Client
	family   host.Family
	firewall host.FirewallState
}

// hosts are the SSH clients of a node command: the server, the node it adds or removes (nil
// when a forced remove cannot reach it), and the other recorded workers by node name.
type hosts struct {
	server, node *sshx.Client
	peers        map[string]*peer
}

// commands counts the remote commands run on every host so far.
func (h *hosts) commands() int64 {
	var n int64
	for _, c := range []*sshx.Client{h.server, h.node} {
		if c != nil {
			n += c.Commands()
		}
	}
	for _, p := range h.peers {
		n += p.c.Commands()
	}
	return n
}

func (h *hosts) close() {
	for _, c := range []*sshx.Client{h.server, h.node} {
		if c != nil {
			_ = c.Close()
		}
	}
	closePeers(h.peers)
}

// dialPeers reaches every recorded worker but skip and those being removed, whose firewalls
// what (the operation, "a join") updates, and reads each one's OS and firewall.
func dialPeers(ctx context.Context, dial func(context.Context, string) (*sshx.Client, error), nodes cluster.Nodes, skip, what string) (map[string]*peer, error) {
	peers := map[string]*peer{}
	for name, w := range nodes.Workers {
		if name == skip || w.State == cluster.WorkerRemoving {
			continue
		}
		c, err := dial(ctx, w.Host)
		if err != nil {
			closePeers(peers)
			return nil, fmt.Errorf("%s updates every node's firewall, and kip cannot reach worker %s at %s: %w; fix SSH to it, then run the same command again", what, name, w.Host, err)
		}
		p := &peer{name: name, worker: w, c: c}
		peers[name] = p
		facts, err := c.Facts(ctx)
		if err == nil {
			p.family, err = host.Identify(facts.OS)
		}
		if err == nil {
			p.firewall, err = host.ReadFirewall(ctx, c)
		}
		if err != nil {
			closePeers(peers)
			return nil, fmt.Errorf("worker %s: %w", name, err)
		}
	}
	return peers, nil
}

func closePeers(peers map[string]*peer) {
	for _, p := range peers {
		_ = p.c.Close()
	}
}

func sshPort(c *sshx.Client) int {
	if p := c.Port(); p != 0 {
		return p
	}
	return 22
}

func sortedPeers(peers map[string]*peer) []string {
	var names []string
	for n := range peers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
