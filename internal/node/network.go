package node

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/sshx"
)

// End is one end of the path between the server and a node: its facts and its public address
// (the address kip reached it at, or its k3s node address).
type End struct {
	Facts  *sshx.Facts
	Public netip.Addr
}

// Want is what the operator asked for: --private-network or --public, neither for automatic.
type Want struct {
	PrivateNetwork netip.Prefix
	Public         bool
}

// Choice is the path Choose picked and how.
type Choice struct {
	Path cluster.Path
	// How says how it was chosen, for the output: "found in both hosts' routing tables".
	How string
	// Suggest: on a first join the only private network found carries the default route; kip
	// checks it, then stops before the join and shows the --private-network value to use.
	Suggest bool
}

// cidrsOfCluster are the k3s pod and Service networks, which a private network must not overlap.
var cidrsOfCluster = []netip.Prefix{host.PodNetwork, host.ServiceNetwork}

// clusterDevices are interfaces whose routes belong to the cluster itself (flannel's and the CNI
// bridge's), never a private network between hosts.
var clusterDevices = []string{"flannel", "cni0", "kube-"}

// Choose decides how the server and a node reach each other, from both hosts' addresses and
// routes, the operator's flags, the cluster's mode (recorded on its first join, "" before) and
// the node's recorded path (a rejoin; nil for a new node). It decides from facts alone; the
// connection checks of a private path (CheckPath) come next.
func Choose(server, node End, want Want, mode string, recorded *cluster.Path) (Choice, error) {
	switch {
	case want.Public && want.PrivateNetwork.IsValid():
		return Choice{}, errors.New("--public and --private-network exclude each other: pass one")
	case want.Public && mode == cluster.ModePrivate:
		return Choice{}, errors.New("this cluster's nodes use private mode, set by its first join, and every node uses it: omit --public")
	case want.PrivateNetwork.IsValid() && mode == cluster.ModePublic:
		return Choice{}, errors.New("this cluster's nodes use public addresses, set by its first join, and every node uses them: omit --private-network")
	case want.Public || mode == cluster.ModePublic:
		return publicChoice(server, node)
	case want.PrivateNetwork.IsValid():
		p, err := pathOn(want.PrivateNetwork, server.Facts, node.Facts)
		return Choice{Path: p, How: "--private-network"}, err
	}
	found, err := privatePaths(server.Facts, node.Facts)
	if err != nil {
		return Choice{}, err
	}
	switch {
	case len(found) == 1:
		return Choice{Path: found[0], How: "found in both hosts' routing tables"}, nil
	case len(found) > 1:
		var nets []string
		for _, p := range found {
			nets = append(nets, p.Network.String())
		}
		return Choice{}, fmt.Errorf("the hosts share more than one private network (%s): choose one with --private-network, e.g. --private-network %s",
			strings.Join(nets, ", "), nets[0])
	}
	if recorded != nil && recorded.Mode == cluster.ModePrivate {
		p, err := pathOn(recorded.Network, server.Facts, node.Facts)
		if err != nil {
			return Choice{}, fmt.Errorf("the node's recorded private path (%s) no longer holds: %w", recorded, err)
		}
		return Choice{Path: p, How: "the node's recorded private addresses"}, nil
	}
	if network, ok := defaultRouteNetwork(server.Facts, node.Facts); ok {
		p, err := pathOn(network, server.Facts, node.Facts)
		if err == nil {
			if mode == cluster.ModePrivate {
				// Not the first join: the cluster is private, and this network is the one there is.
				return Choice{Path: p, How: "the network both hosts' default routes use"}, nil
			}
			return Choice{Path: p, How: "the network both hosts' default routes use", Suggest: true}, nil
		}
	}
	if mode == cluster.ModePrivate {
		return Choice{}, errors.New("this cluster's nodes use private mode, and the node shares no private network with the server: " +
			"connect it to the cluster's private network, or pass --private-network CIDR naming the network they share")
	}
	return publicChoice(server, node)
}

func publicChoice(server, node End) (Choice, error) {
	if !server.Public.Is4() || !node.Public.Is4() {
		return Choice{}, fmt.Errorf("public mode needs an IPv4 address for the server and the node (found %s and %s)", server.Public, node.Public)
	}
	return Choice{Path: cluster.Path{Mode: cluster.ModePublic, Server: server.Public, Node: node.Public}, How: "public addresses"}, nil
}

// CheckNetwork refuses --private-network values that are not an IPv4 network or overlap the
// cluster's pod or Service network.
func CheckNetwork(p netip.Prefix) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("--private-network %s: give an IPv4 network, e.g. 10.0.0.0/16", p)
	}
	if p.Masked() != p {
		return fmt.Errorf("--private-network %s: give the network's address, %s", p, p.Masked())
	}
	return checkOverlap(p)
}

func checkOverlap(p netip.Prefix) error {
	for _, c := range cidrsOfCluster {
		if p.Overlaps(c) {
			return fmt.Errorf("the private network %s overlaps the cluster's pod or Service network (%s and %s): kip refuses it; use a private network outside them, or --public",
				p, host.PodNetwork, host.ServiceNetwork)
		}
	}
	return nil
}

// pathOn is the path over network: each host's address on it.
func pathOn(network netip.Prefix, server, node *sshx.Facts) (cluster.Path, error) {
	if err := checkOverlap(network); err != nil {
		return cluster.Path{}, err
	}
	s, ok := addrOn(server, network)
	if !ok {
		return cluster.Path{}, fmt.Errorf("the server has no address on %s (it has %s)", network, addrList(server))
	}
	n, ok := addrOn(node, network)
	if !ok {
		return cluster.Path{}, fmt.Errorf("the node has no address on %s (it has %s)", network, addrList(node))
	}
	return cluster.Path{Mode: cluster.ModePrivate, Network: network, Server: s, Node: n}, nil
}

func addrOn(f *sshx.Facts, network netip.Prefix) (netip.Addr, bool) {
	for _, a := range f.Addrs {
		if network.Contains(a.CIDR.Addr()) && !clusterDevice(a.Iface) {
			return a.CIDR.Addr(), true
		}
	}
	return netip.Addr{}, false
}

func addrList(f *sshx.Facts) string {
	var s []string
	for _, a := range f.Addrs {
		if !a.CIDR.Addr().IsLoopback() && !clusterDevice(a.Iface) {
			s = append(s, a.CIDR.String())
		}
	}
	if len(s) == 0 {
		return "no IPv4 address"
	}
	return strings.Join(s, ", ")
}

func clusterDevice(dev string) bool {
	return slices.ContainsFunc(clusterDevices, func(p string) bool { return strings.HasPrefix(dev, p) })
}

// privatePaths are the private networks both hosts are on, from the node's routes: a private
// IPv4 network (RFC 1918) routed other than by the default route, on which both hosts have an
// address, and which does not carry either host's default route. One that overlaps the
// cluster's own networks is refused.
func privatePaths(server, node *sshx.Facts) ([]cluster.Path, error) {
	var paths []cluster.Path
	for _, r := range node.Routes {
		if r.Type != "" || r.IsDefault() || !r.Dst.Addr().IsPrivate() || clusterDevice(r.Dev) ||
			slices.ContainsFunc(paths, func(p cluster.Path) bool { return p.Network == r.Dst }) || carriesDefault(r.Dst, server, node) {
			continue
		}
		_, onServer := addrOn(server, r.Dst)
		_, onNode := addrOn(node, r.Dst)
		if !onServer || !onNode {
			continue
		}
		p, err := pathOn(r.Dst, server, node)
		if err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// carriesDefault reports whether network holds either host's default gateway.
func carriesDefault(network netip.Prefix, hosts ...*sshx.Facts) bool {
	for _, f := range hosts {
		for _, r := range f.Routes {
			if r.IsDefault() && r.Type == "" && r.Gateway.IsValid() && network.Contains(r.Gateway) {
				return true
			}
		}
	}
	return false
}

// defaultRouteNetwork is the private network the node's default route goes through, when both
// hosts are on it: cloud VMs of one VPC, whose private network carries the default route.
func defaultRouteNetwork(server, node *sshx.Facts) (netip.Prefix, bool) {
	for _, r := range node.Routes {
		if r.Type != "" || r.IsDefault() || !r.Dst.Addr().IsPrivate() || clusterDevice(r.Dev) || !carriesDefault(r.Dst, node) {
			continue
		}
		if _, ok := addrOn(server, r.Dst); ok {
			return r.Dst, true
		}
	}
	return netip.Prefix{}, false
}
