package host

import (
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/sshx"
)

// FirewallMarker marks a host firewall as managed by kip: with ufw, every rule kip adds carries
// the comment "kip-managed" (ufw allow 6443/tcp comment kip-managed); with firewalld, kip's zone
// FirewalldZone has the description "kip-managed". An active firewall without the marker is the
// operator's: kip leaves it alone and says so.
const FirewallMarker = "kip-managed"

// FirewalldZone is the firewalld zone kip writes, as /etc/firewalld/zones/kipper.xml, and makes
// the default zone when it manages firewalld.
const FirewalldZone = "kipper"

// FirewalldPodZone is the firewalld zone kip writes, as /etc/firewalld/zones/kipper-pods.xml,
// for the rules bound to the pod network's interfaces (PodInterfaces): the zone holds those
// interfaces, and firewalld judges what arrives on them by it rather than by the default zone.
const FirewalldPodZone = "kipper-pods"

// FirewalldPodPolicy is the firewalld policy kip writes with FirewalldPodZone, as
// /etc/firewalld/policies/kipper-pods-out.xml: it forwards what the pod network sends from the
// pod zone's interfaces to any other zone (the nodes' network, the internet). A zone's forward
// covers traffic between its own interfaces only, so without it firewalld refuses a pod's new
// connections out of the host (policies: firewalld 0.9 and later).
const FirewalldPodPolicy = "kipper-pods-out"

// The k3s pod and service networks (k3s's defaults, which kip keeps).
var (
	PodNetwork     = netip.MustParsePrefix("10.42.0.0/16")
	ServiceNetwork = netip.MustParsePrefix("10.43.0.0/16")
)

// PodInterfaces are the interfaces the pod network's traffic arrives on at a node: cni0, the
// bridge of the node's own pods; flannel-wg, flannel's WireGuard backend (kip's clusters); and
// flannel.1, its VXLAN backend (older single-server clusters). Traffic from the pod and service
// networks is trusted on these only: a host on a shared network that sends from a pod address
// arrives on another interface and is denied.
var PodInterfaces = []string{"cni0", "flannel-wg", "flannel.1"}

// FirewallState is what a host's firewall is: Tool "ufw", "firewalld" or "" (neither
// installed), Active (enabled/running), Managed (kip's marker present).
//
// With both tools installed, the state is that of the one that matters most: an active firewall
// that kip does not manage, then an active one, then one kip manages, then ufw.
type FirewallState struct {
	Tool            string
	Active, Managed bool
	// Unbound: kip's own rules trust the pod or service network on every interface, as an older
	// kip wrote them (PodNetworkRules binds them to the pod network's interfaces).
	Unbound bool
}

// Rule is one allowed inbound port. Sources empty = every source. Port 0 is every port, for
// trusted networks: it needs Sources and takes no Proto. Interfaces empty = packets arriving on
// any interface; otherwise only those arriving on one of them (ufw: allow in on IFACE; firewalld:
// the zone FirewalldPodZone, which holds them); a rule bound to interfaces needs Sources, and
// every rule bound to interfaces names the same ones: firewalld puts an interface in one zone.
type Rule struct {
	Port       int
	Proto      string // tcp or udp
	Sources    []netip.Prefix
	Interfaces []string
	Why        string
}

// ServerRules returns the rules of a server: sshPort/tcp, 80/tcp and 443/tcp (Traefik) and
// 6443/tcp (the Kubernetes API) from everywhere, and the pod network's rules (PodNetworkRules).
// Everything else inbound is denied: 8888/tcp and the kubelet's 10250/tcp stay closed to outside
// traffic.
//
// The WireGuard pod network opens nothing more on a single server: 51820/udp carries traffic
// between nodes only, and kip node add opens it, with 10250/tcp and 9100/tcp, to the other
// nodes' addresses when it joins one.
func ServerRules(sshPort int) []Rule {
	return append([]Rule{
		{Port: sshPort, Proto: "tcp", Why: "SSH"},
		{Port: 80, Proto: "tcp", Why: "HTTP (Traefik)"},
		{Port: 443, Proto: "tcp", Why: "HTTPS (Traefik)"},
		{Port: 6443, Proto: "tcp", Why: "the Kubernetes API"},
	}, PodNetworkRules()...)
}

// PodNetworkRules are every port from the pod and service networks on the pod network's
// interfaces (PodInterfaces), which k3s needs trusted under ufw and firewalld (their rules come
// before kube-proxy's, so pods could not reach services or the host otherwise). Bound to those
// interfaces: a host on a network the node shares that sends from a pod address arrives on
// another interface, and reaches none of the host's closed ports (8888/tcp, the kubelet's
// 10250/tcp).
func PodNetworkRules() []Rule {
	return []Rule{
		{Sources: []netip.Prefix{PodNetwork}, Interfaces: slices.Clone(PodInterfaces), Why: "the pod network"},
		{Sources: []netip.Prefix{ServiceNetwork}, Interfaces: slices.Clone(PodInterfaces), Why: "the service network"},
	}
}

// The ports between the nodes of a cluster with workers.
const (
	WireGuardPort   = 51820 // udp: the WireGuard pod network
	KubeletPort     = 10250 // tcp: the kubelet's API, TLS
	NodeMetricsPort = 9100  // tcp: node metrics for Prometheus, TLS with a token
)

// PeerRules are what a node opens to the other nodes, at the addresses they use on the nodes'
// network: 51820/udp and 10250/tcp from every other node, and, on a worker (server valid),
// 9100/tcp from the server. others includes the server on a worker.
func PeerRules(others []netip.Addr, server netip.Addr) []Rule {
	if len(others) == 0 {
		return nil
	}
	var from []netip.Prefix
	for _, a := range others {
		from = append(from, netip.PrefixFrom(a, a.BitLen()))
	}
	rules := []Rule{
		{Port: WireGuardPort, Proto: "udp", Sources: from, Why: "WireGuard, from the other nodes"},
		{Port: KubeletPort, Proto: "tcp", Sources: from, Why: "the kubelet, from the other nodes"},
	}
	if server.IsValid() {
		rules = append(rules, Rule{Port: NodeMetricsPort, Proto: "tcp", Sources: []netip.Prefix{netip.PrefixFrom(server, server.BitLen())}, Why: "node metrics, from the server"})
	}
	return rules
}

// WorkerRules are a worker's own rules, before its peers': SSH is the only port open to every
// source, and the pod network's rules (PodNetworkRules). Everything else inbound is denied,
// 8888/tcp and NodePorts included.
func WorkerRules(sshPort int) []Rule {
	return append([]Rule{{Port: sshPort, Proto: "tcp", Why: "SSH"}}, PodNetworkRules()...)
}

// ServerFirewall are the server's firewall rules with workers, their addresses on the nodes'
// network, as its peers.
func ServerFirewall(sshPort int, workers []netip.Addr) []Rule {
	return append(ServerRules(sshPort), PeerRules(workers, netip.Addr{})...)
}

// WorkerFirewall are a worker's firewall rules with others (the server, at server, among them)
// as its peers.
func WorkerFirewall(sshPort int, server netip.Addr, others []netip.Addr) []Rule {
	return append(WorkerRules(sshPort), PeerRules(others, server)...)
}

// String says what the rule opens, as messages and plans show it: "22/tcp", "every port from
// 10.42.0.0/16 on cni0, flannel-wg and flannel.1", "51820/udp from 10.0.0.2/32 and 10.0.0.3/32".
func (r Rule) String() string {
	s := "every port"
	if r.Port != 0 {
		s = fmt.Sprintf("%d/%s", r.Port, r.Proto)
	}
	var from []string
	for _, p := range r.Sources {
		from = append(from, p.String())
	}
	if len(from) > 0 {
		s += " from " + list(from)
	}
	if len(r.Interfaces) > 0 {
		s += " on " + list(r.Interfaces)
	}
	return s
}

// list joins items as a sentence does: "a", "a and b", "a, b and c".
func list(items []string) string {
	last := len(items) - 1
	if last <= 0 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:last], ", ") + " and " + items[last]
}

// interfaceName is what kip accepts as an interface name: Linux's (at most 15 bytes), without
// the characters ufw and firewalld read as wildcards or separators.
var interfaceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

// validate refuses rules that no firewall should get: bad ports or protocols, invalid sources or
// interfaces, rules bound to different interfaces, and a rule for every port from everywhere,
// which would open the whole host.
func validate(rules []Rule) error {
	var bound []string // the interfaces of the first rule bound to some
	for _, r := range rules {
		for _, name := range r.Interfaces {
			if !interfaceName.MatchString(name) {
				return fmt.Errorf("rule %q: %q is not an interface name", r.Why, name)
			}
		}
		switch {
		case len(r.Interfaces) == 0:
		case bound == nil:
			bound = r.Interfaces
		case !slices.Equal(r.Interfaces, bound):
			return fmt.Errorf("rule %q: bound to %s, where another rule is bound to %s: firewalld puts an interface in one zone",
				r.Why, list(r.Interfaces), list(bound))
		}
		switch {
		case r.Port < 0 || r.Port > 65535:
			return fmt.Errorf("rule %q: port %d is out of range", r.Why, r.Port)
		case r.Port == 0 && r.Proto != "":
			return fmt.Errorf("rule %q: a rule for every port takes no protocol", r.Why)
		case r.Port == 0 && len(r.Sources) == 0:
			return fmt.Errorf("rule %q: every port from every source would open the whole host", r.Why)
		case len(r.Interfaces) > 0 && len(r.Sources) == 0:
			return fmt.Errorf("rule %q: a rule bound to interfaces needs sources", r.Why)
		case r.Port != 0 && r.Proto != "tcp" && r.Proto != "udp":
			return fmt.Errorf("rule %q: protocol %q is not tcp or udp", r.Why, r.Proto)
		}
		for _, p := range r.Sources {
			if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				return fmt.Errorf("rule %q: source %q is not an IPv4 or IPv6 network", r.Why, p)
			}
		}
	}
	return nil
}

// source is a source network as the firewalls print it: the network address, and a single
// address without its prefix length.
func source(p netip.Prefix) string {
	p = p.Masked()
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// firewallTool is how kip drives one host firewall.
type firewallTool interface {
	// inPlace reports whether the firewall found is kip-managed, enforcing, and has exactly
	// rules (valid ones).
	inPlace(p *fwProbe, rules []Rule) bool
	// apply returns the script and its arguments that make the firewall found kip-managed
	// with exactly rules, keeping SSH open throughout.
	apply(p *fwProbe, rules []Rule) (script string, args []string)
}

//go:embed firewall.sh
var firewallScript string

// fwProbe is what firewall.sh found.
type fwProbe struct {
	ufw       ufwState
	firewalld firewalldState
	sshPorts  []int // the ports sshd listens on; empty when sshd -T said nothing
}

// state is the host's firewall, as FirewallState says.
func (p *fwProbe) state() FirewallState {
	return combine(p.ufw, p.firewalld)
}

// readProbe runs firewall.sh on the host: one round trip.
func readProbe(ctx context.Context, c *sshx.Client) (*fwProbe, error) {
	out, err := c.Query(ctx, sshx.Command("sh", "-c", firewallScript, "kip-firewall", FirewalldZone, FirewalldPodZone, FirewalldPodPolicy))
	if err != nil {
		return nil, err
	}
	p, err := parseProbe(string(out))
	if err != nil {
		return nil, fmt.Errorf("read the output of firewall.sh: %w", err)
	}
	return p, nil
}

var probeSections = []string{"ufw", "ufw-added", "firewalld", "firewalld-default", "firewalld-zone", "firewalld-pod-zone", "firewalld-pod-policy", "sshd-ports"}

func parseProbe(out string) (*fwProbe, error) {
	s, err := sshx.Sections(out, "@@kip-firewall", probeSections)
	if err != nil {
		return nil, err
	}
	p := &fwProbe{}
	if p.ufw, err = parseUFW(s["ufw"], s["ufw-added"]); err != nil {
		return nil, fmt.Errorf("ufw: %w", err)
	}
	if p.firewalld, err = parseFirewalld(s["firewalld"], s["firewalld-zone"]); err != nil {
		return nil, fmt.Errorf("firewalld: %w", err)
	}
	p.firewalld.defaultZone = strings.TrimSpace(s["firewalld-default"])
	if strings.TrimSpace(s["firewalld-pod-zone"]) != "" {
		if p.firewalld.podZone, err = parseZone(s["firewalld-pod-zone"]); err != nil {
			return nil, fmt.Errorf("firewalld: zone %s: %w", FirewalldPodZone, err)
		}
	}
	if strings.TrimSpace(s["firewalld-pod-policy"]) != "" {
		if p.firewalld.podPolicy, err = parsePolicy(s["firewalld-pod-policy"]); err != nil {
			return nil, fmt.Errorf("firewalld: policy %s: %w", FirewalldPodPolicy, err)
		}
	}
	for _, f := range strings.Fields(s["sshd-ports"]) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("sshd port %q", f)
		}
		p.sshPorts = append(p.sshPorts, n)
	}
	return p, nil
}

// ParseFirewall reads what a host's firewall is from the output of `ufw status` (or `ufw status
// verbose`), `ufw show added`, `firewall-cmd --state` and the file of kip's firewalld zone
// (/etc/firewalld/zones/kipper.xml); an empty string stands for a tool or file that is missing.
// Preflight and ReadFirewall share it.
func ParseFirewall(ufwStatus, ufwAdded, firewalldState, firewalldZone string) (FirewallState, error) {
	u, err := parseUFW(ufwStatus, ufwAdded)
	if err != nil {
		return FirewallState{}, fmt.Errorf("ufw: %w", err)
	}
	fd, err := parseFirewalld(firewalldState, firewalldZone)
	if err != nil {
		return FirewallState{}, fmt.Errorf("firewalld: %w", err)
	}
	return combine(u, fd), nil
}

// unbound returns rules with the interfaces left out: the rules as kip wrote them before it bound
// the pod network's to the pod network's interfaces.
func unbound(rules []Rule) []Rule {
	out := slices.Clone(rules)
	for i := range out {
		out[i].Interfaces = nil
	}
	return out
}

// combine returns the state of the firewall that matters most (see FirewallState).
func combine(u ufwState, fd firewalldState) FirewallState {
	var installed []FirewallState
	if u.installed {
		installed = append(installed, FirewallState{Tool: "ufw", Active: u.active, Managed: u.managed, Unbound: u.unbound()})
	}
	if fd.installed {
		installed = append(installed, FirewallState{Tool: "firewalld", Active: fd.running, Managed: fd.managed, Unbound: fd.unbound()})
	}
	for _, first := range []func(FirewallState) bool{
		func(s FirewallState) bool { return s.Active && !s.Managed },
		func(s FirewallState) bool { return s.Active },
		func(s FirewallState) bool { return s.Managed },
		func(FirewallState) bool { return true },
	} {
		if i := slices.IndexFunc(installed, first); i >= 0 {
			return installed[i]
		}
	}
	return FirewallState{}
}

// ReadFirewall returns what the host's firewall is, in one round trip.
func ReadFirewall(ctx context.Context, c *sshx.Client) (FirewallState, error) {
	p, err := readProbe(ctx, c)
	if err != nil {
		return FirewallState{}, fmt.Errorf("read the firewall: %w", err)
	}
	return p.state(), nil
}

// FirewallInPlace reports whether the host's firewall is f's (ufw or firewalld), active,
// kip-managed, and holds exactly kip's rules: with ufw, the rules marked kip-managed and a
// default deny of incoming traffic (rules the operator added without the marker are theirs and
// left alone); with firewalld, the zone FirewalldZone as the default zone. One round trip.
func (f Family) FirewallInPlace(ctx context.Context, c *sshx.Client, rules []Rule) (bool, error) {
	if err := validate(rules); err != nil {
		return false, fmt.Errorf("check the firewall: %w", err)
	}
	p, err := readProbe(ctx, c)
	if err != nil {
		return false, fmt.Errorf("check the firewall: %w", err)
	}
	return f.inPlace(p, rules), nil
}

func (f Family) inPlace(p *fwProbe, rules []Rule) bool {
	st := p.state()
	return st.Tool == f.Firewall && st.Active && st.Managed && f.firewall.inPlace(p, rules)
}

// ApplyFirewall makes the host's firewall kip-managed with exactly these rules: it installs
// f's firewall (ufw or firewalld) when missing, opens the rules before it enables the firewall
// so that the SSH session never drops, and marks it with FirewallMarker (ufw: rule comments;
// firewalld: the zone FirewalldZone, whose description is the marker, as the default zone).
//
// With ufw, kip takes over an inactive ufw with `ufw --force reset` (ufw keeps the old rules
// files beside the new, with a date suffix); on a kip-managed ufw it adds the missing rules
// first and then deletes its stale ones, and leaves rules the operator added without the
// marker. With firewalld, kip writes its zone file and reloads firewalld (or starts it when
// stopped), then restarts k3s if it runs: a reload drops the rules k3s added.
//
// It refuses, naming the fix, when an active firewall is not kip-managed (an operator's
// firewall is left alone), when another firewall than f's is active, and when the rules open
// none of the ports sshd listens on to every source (SSH would be locked out). Nothing changes
// when the firewall is in place. Two round trips: one to look, one to change.
func (f Family) ApplyFirewall(ctx context.Context, c *sshx.Client, rules []Rule) error {
	if err := validate(rules); err != nil {
		return fmt.Errorf("apply the firewall: %w", err)
	}
	p, err := readProbe(ctx, c)
	if err != nil {
		return fmt.Errorf("apply the firewall: %w", err)
	}
	if err := f.refuse(c.Host(), p, rules); err != nil {
		return err
	}
	if f.inPlace(p, rules) {
		return nil
	}
	res, err := c.Run(ctx, f.applyCommand(p, rules))
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		return fmt.Errorf("apply the %s rules: %w", f.Firewall, err)
	}
	return nil
}

// applyCommand returns the command that installs f's firewall when missing and applies rules.
func (f Family) applyCommand(p *fwProbe, rules []Rule) string {
	script, args := f.firewall.apply(p, rules)
	pkg := []string{f.Firewall}
	return fmt.Sprintf(`if [ -n "$(%s)" ]; then { %s; } >/dev/null; fi && %s`,
		f.MissingPackagesCommand(pkg), f.InstallPackagesCommand(pkg),
		sshx.Command("sh", append([]string{"-c", script, "kip-" + f.Firewall}, args...)...))
}

// refuse returns why kip must not touch the firewall found, with the fix, or nil.
func (f Family) refuse(host string, p *fwProbe, rules []Rule) error {
	st := p.state()
	off := map[string]string{"ufw": "ufw disable", "firewalld": "systemctl disable --now firewalld"}
	switch {
	case st.Active && !st.Managed:
		return fmt.Errorf("%s on %s is active and not managed by kip: kip leaves an operator's firewall alone; "+
			"allow %s in it yourself, or turn it off (%s) and run the command again to let kip manage %s",
			st.Tool, host, Describe(rules), off[st.Tool], f.Firewall)
	case st.Active && st.Tool != f.Firewall:
		return fmt.Errorf("%s is active on %s, where kip manages %s: two firewalls would filter the same traffic; "+
			"turn %s off (%s) and run the command again", st.Tool, host, f.Firewall, st.Tool, off[st.Tool])
	}
	if len(p.sshPorts) == 0 {
		return nil // sshd -T said nothing: nothing to check against
	}
	for _, r := range rules {
		if r.Proto == "tcp" && len(r.Sources) == 0 && len(r.Interfaces) == 0 && slices.Contains(p.sshPorts, r.Port) {
			return nil
		}
	}
	var ports []string
	for _, n := range p.sshPorts {
		ports = append(ports, fmt.Sprintf("%d/tcp", n))
	}
	return fmt.Errorf("the firewall rules for %s open none of the ports sshd listens on (%s) to every source: "+
		"enabling %s would lock SSH out; give kip the SSH port sshd listens on", host, strings.Join(ports, ", "), f.Firewall)
}

// Describe lists rules for a message: "22/tcp, 80/tcp, every port from 10.42.0.0/16 on cni0,
// flannel-wg and flannel.1".
func Describe(rules []Rule) string {
	var s []string
	for _, r := range rules {
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}
