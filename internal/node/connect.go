package node

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"kipper.run/kip/internal/sshx"
)

// connectTimeout bounds one connection check.
const connectTimeout = "5"

// Connects reports whether a TCP connection from the host c reaches addr:port, within five
// seconds (bash's /dev/tcp, which every supported OS's bash has).
func Connects(ctx context.Context, c *sshx.Client, addr netip.Addr, port int) (bool, error) {
	res, err := c.Run(ctx, sshx.Command("timeout", connectTimeout, "bash", "-c", `exec 3<>"/dev/tcp/$0/$1"`, addr.String(), strconv.Itoa(port)))
	if err != nil {
		return false, err
	}
	return res.ExitStatus == 0, nil
}

// CheckPath checks a private path both ways, as the nodes will use it: the server connects to
// the node's SSH port, and the node to the server's API on 6443. A failed connection stops the
// join, naming it.
func CheckPath(ctx context.Context, server, node *sshx.Client, p Path, nodeSSHPort int) error {
	for _, c := range []struct {
		from *sshx.Client
		to   netip.Addr
		port int
		who  string
	}{
		{server, p.Node, nodeSSHPort, "the server cannot connect to the node's SSH port"},
		{node, p.Server, 6443, "the node cannot connect to the server's API"},
	} {
		ok, err := Connects(ctx, c.from, c.to, c.port)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s at %s over %s: open %d/tcp between the hosts on that network, or pass --public to join over public addresses",
				c.who, netip.AddrPortFrom(c.to, uint16(c.port)), p, c.port)
		}
	}
	return nil
}
