package host

import (
	_ "embed"
	"encoding/xml"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// firewalldState is what firewall-cmd --state, firewalld.conf and kip's zone files say.
type firewalldState struct {
	installed, running, managed bool
	defaultZone                 string  // DefaultZone in firewalld.conf
	zone                        *zone   // kip's zone file (FirewalldZone); nil when missing
	podZone                     *zone   // kip's pod zone file (FirewalldPodZone); nil when missing
	podPolicy                   *policy // kip's pod policy file (FirewalldPodPolicy); nil when missing
}

// parseFirewalld reads firewall-cmd --state (empty when firewalld is not installed) and the
// file of kip's zone (empty when missing): firewalld is kip-managed when that zone's
// description is FirewallMarker.
func parseFirewalld(state, zoneFile string) (firewalldState, error) {
	state = strings.TrimSpace(state)
	fd := firewalldState{installed: state != "", running: state == "running"}
	if strings.TrimSpace(zoneFile) == "" {
		return fd, nil
	}
	z, err := parseZone(zoneFile)
	if err != nil {
		return firewalldState{}, fmt.Errorf("zone %s: %w", FirewalldZone, err)
	}
	fd.zone, fd.managed = z, strings.TrimSpace(z.Description) == FirewallMarker
	return fd, nil
}

// unbound reports whether kip's main zone trusts the pod or service network: it holds every
// interface no zone names.
func (fd firewalldState) unbound() bool {
	if fd.zone == nil {
		return false
	}
	main, _ := renderZones(unbound(PodNetworkRules()))
	return slices.ContainsFunc(main.Rules, func(r zoneRule) bool {
		return slices.ContainsFunc(fd.zone.Rules, func(have zoneRule) bool {
			return have.Port == nil && have.Source != nil && r.Source != nil && canonicalAddress(have.Source.Address) == canonicalAddress(r.Source.Address)
		})
	})
}

// zone is a firewalld zone file (firewalld.zone(5)): the parts kip writes, and any other
// element, so that a zone with more in it is not kip's.
type zone struct {
	XMLName     xml.Name        `xml:"zone"`
	Target      string          `xml:"target,attr,omitempty"`
	Short       string          `xml:"short,omitempty"`
	Description string          `xml:"description,omitempty"`
	Interfaces  []zoneInterface `xml:"interface"`
	Ports       []zonePort      `xml:"port"`
	Rules       []zoneRule      `xml:"rule"`
	Forward     *struct{}       `xml:"forward"`
	Other       []xmlElement    `xml:",any"`
}

// zoneInterface binds an interface to the zone: firewalld judges what arrives on it by the zone.
type zoneInterface struct {
	Name string `xml:"name,attr"`
}

type zonePort struct {
	Port     string `xml:"port,attr"`
	Protocol string `xml:"protocol,attr"`
}

// zoneRule is a rich rule: accept from a source, to a port or to all.
type zoneRule struct {
	Family string       `xml:"family,attr,omitempty"`
	Source *zoneSource  `xml:"source"`
	Port   *zonePort    `xml:"port"`
	Accept *struct{}    `xml:"accept"`
	Other  []xmlElement `xml:",any"`
}

type zoneSource struct {
	Address string `xml:"address,attr"`
	Invert  string `xml:"invert,attr,omitempty"`
}

type xmlElement struct{ XMLName xml.Name }

// policy is a firewalld policy file (firewalld.policy(5)): what firewalld does with traffic from
// its ingress zones to its egress zones, here forwarded traffic.
type policy struct {
	XMLName     xml.Name     `xml:"policy"`
	Target      string       `xml:"target,attr,omitempty"`
	Short       string       `xml:"short,omitempty"`
	Description string       `xml:"description,omitempty"`
	Ingress     []policyZone `xml:"ingress-zone"`
	Egress      []policyZone `xml:"egress-zone"`
	Rules       []zoneRule   `xml:"rule"`
	Other       []xmlElement `xml:",any"`
}

type policyZone struct {
	Name string `xml:"name,attr"`
}

func parsePolicy(s string) (*policy, error) { return parseXML[policy](s) }

// podPolicy is kip's policy for the pod zone: what the pod network (sources, the pod zone's rich
// rules' sources) sends from the pod zone to any other zone is accepted; the rest goes on to the
// zones' own rules (target CONTINUE).
func podPolicy(pods *zone) *policy {
	p := &policy{Target: "CONTINUE", Short: "Kipper pods out", Description: FirewallMarker,
		Ingress: []policyZone{{Name: FirewalldPodZone}}, Egress: []policyZone{{Name: "ANY"}}}
	for _, r := range pods.Rules {
		if r.Port == nil {
			p.Rules = append(p.Rules, zoneRule{Family: r.Family, Source: r.Source, Accept: &struct{}{}})
		}
	}
	return p
}

// file returns the policy as firewalld reads it.
func (p *policy) file() string { return xmlFile(p) }

// key returns what the policy does, in a canonical form (zone.key's, with its zones).
func (p *policy) key() string {
	z := zone{Target: p.Target, Description: p.Description, Rules: p.Rules, Other: p.Other}
	items := []string{z.key()}
	for _, i := range p.Ingress {
		items = append(items, "ingress "+i.Name)
	}
	for _, e := range p.Egress {
		items = append(items, "egress "+e.Name)
	}
	slices.Sort(items[1:])
	return strings.Join(items, "\n")
}

func parseZone(s string) (*zone, error) { return parseXML[zone](s) }

// parseXML reads a zone's or policy's file (xmlFile writes them).
func parseXML[T any](s string) (*T, error) {
	var v T
	if err := xml.Unmarshal([]byte(s), &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// renderZones returns kip's zones for rules. The zone FirewalldZone, made the default zone, holds
// every interface no zone names: the rules bound to no interface, as ports open to every source
// and rich rules for ports open to some sources, with intra-zone forwarding. The zone
// FirewalldPodZone holds the interfaces rules are bound to (PodInterfaces), and those rules as
// rich rules; nil when no rule is bound to interfaces. Its intra-zone forwarding lets pods reach
// each other across cni0 and flannel's interfaces. No zone names a source: firewalld picks a
// zone by a packet's source before its interface, so a zone with the pod network as a source
// would take in spoofed pod addresses on any interface. Everything else gets the default target:
// rejected.
func renderZones(rules []Rule) (main, pods *zone) {
	main = &zone{Short: "Kipper", Description: FirewallMarker, Forward: &struct{}{}}
	for _, r := range rules {
		z := main
		if len(r.Interfaces) > 0 {
			if pods == nil {
				pods = &zone{Short: "Kipper pods", Description: FirewallMarker, Forward: &struct{}{}}
				for _, name := range r.Interfaces { // validate: every bound rule names the same ones
					pods.Interfaces = append(pods.Interfaces, zoneInterface{Name: name})
				}
			}
			z = pods
		}
		port := &zonePort{Port: strconv.Itoa(r.Port), Protocol: r.Proto}
		if len(r.Sources) == 0 {
			z.Ports = append(z.Ports, *port)
			continue
		}
		if r.Port == 0 {
			port = nil
		}
		for _, p := range r.Sources {
			family := "ipv4"
			if p.Addr().Is6() {
				family = "ipv6"
			}
			z.Rules = append(z.Rules, zoneRule{Family: family, Source: &zoneSource{Address: source(p)}, Port: port, Accept: &struct{}{}})
		}
	}
	return main, pods
}

// file returns the zone as firewalld reads it.
func (z *zone) file() string { return xmlFile(z) }

// xmlFile is a zone's or policy's file: their fields are strings and empty structs, so they
// always marshal.
func xmlFile(v any) string {
	b, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return xml.Header + string(b) + "\n"
}

// key returns what the zone does, in a canonical form: two zones with the same key filter
// alike, however their files are laid out.
func (z *zone) key() string {
	items := []string{"target=" + z.Target, "description=" + strings.TrimSpace(z.Description), fmt.Sprint("forward=", z.Forward != nil)}
	for _, i := range z.Interfaces {
		items = append(items, "interface "+i.Name)
	}
	port := func(p *zonePort) string {
		if p == nil {
			return "all"
		}
		return p.Port + "/" + p.Protocol
	}
	for _, p := range z.Ports {
		items = append(items, "port "+port(&p))
	}
	for _, r := range z.Rules {
		src := "-"
		if r.Source != nil {
			src = canonicalAddress(r.Source.Address) + " invert=" + r.Source.Invert
		}
		items = append(items, fmt.Sprintf("rule %s from %s to %s accept=%v other=%d", r.Family, src, port(r.Port), r.Accept != nil, len(r.Other)))
	}
	for _, o := range z.Other {
		items = append(items, "other "+o.XMLName.Local)
	}
	slices.Sort(items[3:])
	return strings.Join(slices.Compact(items), "\n")
}

// canonicalAddress writes an address or network as source does, or leaves it as it is.
func canonicalAddress(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil {
		return source(p)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.String()
	}
	return s
}

// firewalld drives firewalld.
type firewalld struct{}

//go:embed firewalld.sh
var firewalldScript string

func (firewalld) inPlace(p *fwProbe, rules []Rule) bool {
	fd := p.firewalld
	main, pods := renderZones(rules)
	return fd.running && fd.defaultZone == FirewalldZone && fd.zone != nil && fd.zone.key() == main.key() &&
		(fd.podZone == nil) == (pods == nil) && (pods == nil || fd.podZone.key() == pods.key()) &&
		(fd.podPolicy == nil) == (pods == nil) && (pods == nil || fd.podPolicy.key() == podPolicy(pods).key())
}

// apply writes kip's zones and the pod zone's policy and makes firewalld enforce them (see
// firewalld.sh); without a pod zone, it removes the pod zone's and the policy's files. The zone opens SSH before firewalld starts or reloads.
func (firewalld) apply(_ *fwProbe, rules []Rule) (string, []string) {
	main, pods := renderZones(rules)
	podFile, policyFile := "", ""
	if pods != nil {
		podFile, policyFile = pods.file(), podPolicy(pods).file()
	}
	return firewalldScript, []string{FirewalldZone, main.file(), FirewalldPodZone, podFile, FirewalldPodPolicy, policyFile}
}
