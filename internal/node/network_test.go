package node

import (
	"net/netip"
	"strings"
	"testing"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/sshx"
)

// hostFacts builds a host's addresses (iface=cidr) and routes ("dst dev [via gw]").
func hostFacts(addrs []string, routes ...string) *sshx.Facts {
	f := &sshx.Facts{}
	for _, a := range addrs {
		iface, cidr, _ := strings.Cut(a, "=")
		f.Addrs = append(f.Addrs, sshx.Addr{Iface: iface, CIDR: netip.MustParsePrefix(cidr)})
	}
	for _, r := range routes {
		w := strings.Fields(r)
		rt := sshx.Route{Dst: netip.MustParsePrefix(w[0]), Dev: w[1]}
		if len(w) == 4 && w[2] == "via" {
			rt.Gateway = netip.MustParseAddr(w[3])
		}
		f.Routes = append(f.Routes, rt)
	}
	return f
}

func end(f *sshx.Facts, public string) End { return End{Facts: f, Public: netip.MustParseAddr(public)} }

func TestChoose(t *testing.T) {
	// The lab's hosts: a private network on eth0, the default route on the public eth1. The
	// server also has the cluster's own flannel and CNI routes.
	labServer := end(hostFacts([]string{"eth0=10.77.0.20/24", "eth1=198.51.100.20/24", "cni0=10.42.0.1/24", "flannel-wg=10.42.0.0/32"},
		"0.0.0.0/0 eth1 via 198.51.100.1", "10.77.0.0/24 eth0", "198.51.100.0/24 eth1", "10.42.0.0/24 cni0", "10.42.1.0/24 flannel-wg"), "198.51.100.20")
	labNode := end(hostFacts([]string{"eth0=10.77.0.21/24", "eth1=198.51.100.21/24"},
		"0.0.0.0/0 eth1 via 198.51.100.1", "10.77.0.0/24 eth0", "198.51.100.0/24 eth1"), "198.51.100.21")
	// Two hosts at different providers: nothing private in common.
	lone := end(hostFacts([]string{"eth0=203.0.113.11/24"}, "0.0.0.0/0 eth0 via 203.0.113.1", "203.0.113.0/24 eth0"), "203.0.113.11")
	// Cloud VMs of one VPC: the private network carries the default route.
	vpcServer := end(hostFacts([]string{"ens5=10.0.1.10/16"}, "0.0.0.0/0 ens5 via 10.0.0.1", "10.0.0.0/16 ens5"), "54.0.0.10")
	vpcNode := end(hostFacts([]string{"ens5=10.0.2.11/16"}, "0.0.0.0/0 ens5 via 10.0.0.1", "10.0.0.0/16 ens5"), "54.0.0.11")
	// A Hetzner-like private network on ens10 overlapping the pod network.
	overlapServer := end(hostFacts([]string{"eth0=198.51.100.20/24", "ens10=10.42.200.2/32"},
		"0.0.0.0/0 eth0 via 198.51.100.1", "10.42.200.0/24 ens10 via 10.42.200.1"), "198.51.100.20")
	overlapNode := end(hostFacts([]string{"eth0=198.51.100.21/24", "ens10=10.42.200.3/32"},
		"0.0.0.0/0 eth0 via 198.51.100.1", "10.42.200.0/24 ens10 via 10.42.200.1"), "198.51.100.21")
	twoNets := end(hostFacts([]string{"eth0=10.77.0.21/24", "eth1=198.51.100.21/24", "eth2=192.168.5.21/24"},
		"0.0.0.0/0 eth1 via 198.51.100.1", "10.77.0.0/24 eth0", "192.168.5.0/24 eth2"), "198.51.100.21")
	twoNetsServer := end(hostFacts([]string{"eth0=10.77.0.20/24", "eth1=198.51.100.20/24", "eth2=192.168.5.20/24"},
		"0.0.0.0/0 eth1 via 198.51.100.1", "10.77.0.0/24 eth0", "192.168.5.0/24 eth2"), "198.51.100.20")
	labPath := cluster.Path{Mode: cluster.ModePrivate, Network: netip.MustParsePrefix("10.77.0.0/24"),
		Server: netip.MustParseAddr("10.77.0.20"), Node: netip.MustParseAddr("10.77.0.21")}
	vpcPath := cluster.Path{Mode: cluster.ModePrivate, Network: netip.MustParsePrefix("10.0.0.0/16"),
		Server: netip.MustParseAddr("10.0.1.10"), Node: netip.MustParseAddr("10.0.2.11")}

	for _, tc := range []struct {
		name         string
		server, node End
		want         Want
		mode         string
		recorded     *cluster.Path
		path         cluster.Path
		suggest      bool
		err          string
	}{
		{name: "private, found", server: labServer, node: labNode, path: labPath},
		{name: "private, on a private cluster", server: labServer, node: labNode, mode: cluster.ModePrivate, path: labPath},
		{name: "--public over a private network", server: labServer, node: labNode, want: Want{Public: true},
			path: cluster.Path{Mode: cluster.ModePublic, Server: netip.MustParseAddr("198.51.100.20"), Node: netip.MustParseAddr("198.51.100.21")}},
		{name: "public cluster keeps public", server: labServer, node: labNode, mode: cluster.ModePublic,
			path: cluster.Path{Mode: cluster.ModePublic, Server: netip.MustParseAddr("198.51.100.20"), Node: netip.MustParseAddr("198.51.100.21")}},
		{name: "nothing shared: public", server: labServer, node: lone,
			path: cluster.Path{Mode: cluster.ModePublic, Server: netip.MustParseAddr("198.51.100.20"), Node: netip.MustParseAddr("203.0.113.11")}},
		{name: "nothing shared on a private cluster", server: labServer, node: lone, mode: cluster.ModePrivate,
			err: "this cluster's nodes use private mode, and the node shares no private network with the server"},
		{name: "--public on a private cluster", server: labServer, node: labNode, mode: cluster.ModePrivate, want: Want{Public: true},
			err: "this cluster's nodes use private mode, set by its first join, and every node uses it: omit --public"},
		{name: "--private-network on a public cluster", server: vpcServer, node: vpcNode, mode: cluster.ModePublic,
			want: Want{PrivateNetwork: netip.MustParsePrefix("10.0.0.0/16")}, err: "omit --private-network"},
		{name: "both flags", server: labServer, node: labNode, want: Want{Public: true, PrivateNetwork: netip.MustParsePrefix("10.77.0.0/24")},
			err: "--public and --private-network exclude each other"},
		{name: "the default route's network: suggested", server: vpcServer, node: vpcNode, path: vpcPath, suggest: true},
		{name: "the default route's network, asked for", server: vpcServer, node: vpcNode,
			want: Want{PrivateNetwork: netip.MustParsePrefix("10.0.0.0/16")}, path: vpcPath},
		{name: "the default route's network on a private cluster", server: vpcServer, node: vpcNode, mode: cluster.ModePrivate, path: vpcPath},
		{name: "the recorded path", server: vpcServer, node: vpcNode, mode: cluster.ModePrivate, recorded: &vpcPath, path: vpcPath},
		{name: "a recorded path that no longer holds", server: labServer, node: lone, mode: cluster.ModePrivate, recorded: &labPath,
			err: "the node's recorded private path (private network 10.77.0.0/24 (server 10.77.0.20, node 10.77.0.21)) no longer holds: the node has no address on 10.77.0.0/24 (it has 203.0.113.11/24)"},
		{name: "--private-network the node is not on", server: labServer, node: labNode,
			want: Want{PrivateNetwork: netip.MustParsePrefix("192.168.9.0/24")}, err: "the server has no address on 192.168.9.0/24 (it has 10.77.0.20/24, 198.51.100.20/24)"},
		{name: "an overlapping network found", server: overlapServer, node: overlapNode,
			err: "the private network 10.42.200.0/24 overlaps the cluster's pod or Service network (10.42.0.0/16 and 10.43.0.0/16): kip refuses it; use a private network outside them, or --public"},
		{name: "an overlapping network asked for", server: overlapServer, node: overlapNode, want: Want{PrivateNetwork: netip.MustParsePrefix("10.42.200.0/24")},
			err: "overlaps the cluster's pod or Service network"},
		{name: "two private networks", server: twoNetsServer, node: twoNets,
			err: "the hosts share more than one private network (10.77.0.0/24, 192.168.5.0/24): choose one with --private-network, e.g. --private-network 10.77.0.0/24"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Choose(tc.server, tc.node, tc.want, tc.mode, tc.recorded)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Path != tc.path || c.Suggest != tc.suggest {
				t.Errorf("chose %+v (suggest %v), want %+v (suggest %v)", c.Path, c.Suggest, tc.path, tc.suggest)
			}
		})
	}
}

func TestCheckNetwork(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0/16":    "",
		"10.0.0.5/16":    "--private-network 10.0.0.5/16: give the network's address, 10.0.0.0/16",
		"10.43.0.0/24":   "the private network 10.43.0.0/24 overlaps",
		"10.0.0.0/8":     "the private network 10.0.0.0/8 overlaps",
		"fd00::/64":      "--private-network fd00::/64: give an IPv4 network",
		"192.168.0.0/24": "",
	} {
		err := CheckNetwork(netip.MustParsePrefix(in))
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("CheckNetwork(%s) = %v, want %q", in, err, want)
		}
	}
}

// TestCheckRejoinAddress refuses a worker rejoining at a new public address, and lets one rejoin
// at a new private address (recorded and published) or at its recorded public one.
func TestCheckRejoinAddress(t *testing.T) {
	pub := func(node string) *cluster.Path {
		return &cluster.Path{Mode: cluster.ModePublic, Server: netip.MustParseAddr("203.0.113.10"), Node: netip.MustParseAddr(node)}
	}
	priv := func(node string) *cluster.Path {
		return &cluster.Path{Mode: cluster.ModePrivate, Network: netip.MustParsePrefix("10.0.0.0/16"), Server: netip.MustParseAddr("10.0.0.2"), Node: netip.MustParseAddr(node)}
	}
	if err := checkRejoinAddress(nil, *pub("198.51.100.7"), "w1"); err != nil {
		t.Errorf("a new worker: %v", err)
	}
	if err := checkRejoinAddress(pub("198.51.100.7"), *pub("198.51.100.7"), "w1"); err != nil {
		t.Errorf("the same public address: %v", err)
	}
	if err := checkRejoinAddress(priv("10.0.0.7"), *priv("10.0.0.9"), "w1"); err != nil {
		t.Errorf("a new private address: %v", err)
	}
	err := checkRejoinAddress(pub("198.51.100.7"), *pub("198.51.100.9"), "w1")
	if want := "worker w1 answers at 198.51.100.9, and its recorded public address is 198.51.100.7: in public mode the other nodes reach it at that address"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a new public address: %v, want %q", err, want)
	}
}
