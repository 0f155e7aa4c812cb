package cli

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// CheckHost checks a host the operator names (flag: "--host", or "HOST" for an argument): an
// IPv4 or IPv6 address, a DNS name, or a Host alias of ~/.ssh/config. A port, a user or anything
// that looks like a flag is a usage error.
func CheckHost(flag, h string) error {
	usage := func(why string) error {
		return Usagef("%s %q: %s", flag, h, why)
	}
	if addr, err := netip.ParseAddr(h); err == nil {
		if addr.Zone() != "" {
			return usage("give the address without a zone")
		}
		return nil
	}
	switch {
	case strings.HasPrefix(h, "-"):
		return usage("give the host's address or name, e.g. 203.0.113.10")
	case strings.ContainsAny(h, "@/ "):
		return usage("give the host's address or name only; set the user with --ssh-user and the port with --ssh-port")
	}
	if name, port, err := net.SplitHostPort(h); err == nil {
		example := name
		if strings.HasPrefix(flag, "--") {
			example = flag + " " + name
		}
		return usage(fmt.Sprintf("give the port with --ssh-port: %s --ssh-port %s", example, port))
	}
	if strings.Trim(h, "0123456789.") == "" {
		return usage("not an IPv4 address: each of its four numbers is 0 to 255, e.g. 203.0.113.10")
	}
	if len(h) > 253 {
		return usage("a name is at most 253 characters")
	}
	for _, label := range strings.Split(h, ".") {
		ok := label != "" && len(label) <= 63 && !strings.HasPrefix(label, "-") && !strings.HasSuffix(label, "-") &&
			strings.Trim(label, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") == ""
		if !ok {
			return usage("not an IP address or a host name (letters, digits, hyphens and dots)")
		}
	}
	return nil
}
