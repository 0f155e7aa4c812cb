package sshx

import (
	"net/netip"
	"testing"
)

func TestNodeIP(t *testing.T) {
	addr := func(s string) Addr { return Addr{Iface: "eth0", CIDR: netip.MustParsePrefix(s)} }
	facts := &Facts{
		Addrs: []Addr{addr("10.77.0.15/24"), addr("198.51.100.15/24")},
		Routes: []Route{
			{Dst: netip.MustParsePrefix("10.77.0.0/24"), Dev: "eth1", Src: netip.MustParseAddr("10.77.0.15")},
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("198.51.100.1"), Dev: "eth0", Src: netip.MustParseAddr("198.51.100.15")},
		},
	}
	for host, want := range map[string]string{
		"10.77.0.15":      "10.77.0.15",    // one of the host's addresses
		"198.51.100.15":   "198.51.100.15", // also one
		"srv.example.com": "198.51.100.15", // a name: the default route's source
		"203.0.113.10":    "198.51.100.15", // NAT: the address is not on the host
	} {
		if got, err := facts.NodeIP(host); err != nil || got != want {
			t.Errorf("NodeIP(%s) = %s, %v; want %s", host, got, err, want)
		}
	}
	if _, err := (&Facts{}).NodeIP("h"); err == nil {
		t.Error("no addresses: want an error")
	}
}
