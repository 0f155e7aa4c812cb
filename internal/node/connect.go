package node

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/sshx"
)

// connectTimeout bounds one connection check.
const connectTimeout = "5"

// apiPort is the server's Kubernetes API port, which the nodes reach it on.
const apiPort = 6443

// Connects reports whether a TCP connection from the host c reaches addr:port, within five
// seconds (bash's /dev/tcp, which every supported OS's bash has). It answers false only when
// the check ran and the connection was refused, found no route, or timed out; any other outcome
// (bash or timeout missing, a check that could not run) is an error, so that a caller deciding
// that a host is gone never decides it from a check that did not happen.
func Connects(ctx context.Context, c *sshx.Client, addr netip.Addr, port int) (bool, error) {
	res, err := c.Probe(ctx, sshx.Command("timeout", connectTimeout, "bash", "-c", `exec 3<>"/dev/tcp/$0/$1"`, addr.String(), strconv.Itoa(port)))
	if err != nil {
		return false, err
	}
	return connected(res, netip.AddrPortFrom(addr, uint16(port)))
}

// timedOut is timeout(1)'s exit status when the command ran out of time.
const timedOut = 124

// notConnected are bash's words for a connection that was tried and did not happen.
var notConnected = []string{"Connection refused", "No route to host", "Network is unreachable", "Connection timed out", "Host is unreachable"}

// connected reads the outcome of Connects' check to target.
func connected(res sshx.Result, target netip.AddrPort) (bool, error) {
	switch {
	case res.ExitStatus == 0:
		return true, nil
	case res.ExitStatus == timedOut:
		return false, nil
	case res.ExitStatus == 1 && slices.ContainsFunc(notConnected, func(s string) bool { return strings.Contains(string(res.Stderr), s) }):
		return false, nil
	}
	return false, fmt.Errorf("the check whether %s accepts connections did not run as it should (%w), so kip cannot tell whether it answers", target, res.Err())
}

// CheckPath checks a private path both ways, as the nodes will use it: the server connects to
// the node's SSH port, and the node to the server's API on 6443. A failed connection stops the
// join, naming it, and --public when the join may still choose public addresses (the first
// join chooses the mode for every node).
func CheckPath(ctx context.Context, server, node *sshx.Client, p cluster.Path, nodeSSHPort int, mayGoPublic bool) error {
	for _, c := range []struct {
		from *sshx.Client
		to   netip.Addr
		port int
		who  string
	}{
		{server, p.Node, nodeSSHPort, "the server cannot connect to the node's SSH port"},
		{node, p.Server, apiPort, "the node cannot connect to the server's API"},
	} {
		ok, err := Connects(ctx, c.from, c.to, c.port)
		if err != nil {
			return err
		}
		if !ok {
			or := ""
			if mayGoPublic {
				or = ", or pass --public to join over public addresses"
			}
			return fmt.Errorf("%s at %s over %s: open %d/tcp between the hosts on that network%s",
				c.who, netip.AddrPortFrom(c.to, uint16(c.port)), p, c.port, or)
		}
	}
	return nil
}
