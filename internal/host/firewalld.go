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

// firewalldState is what firewall-cmd --state, firewalld.conf and kip's zone file say.
type firewalldState struct {
	installed, running, managed bool
	defaultZone                 string // DefaultZone in firewalld.conf
	zone                        *zone  // kip's zone file; nil when missing
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

// zone is a firewalld zone file (firewalld.zone(5)): the parts kip writes, and any other
// element, so that a zone with more in it is not kip's.
type zone struct {
	XMLName     xml.Name     `xml:"zone"`
	Target      string       `xml:"target,attr,omitempty"`
	Short       string       `xml:"short,omitempty"`
	Description string       `xml:"description,omitempty"`
	Ports       []zonePort   `xml:"port"`
	Rules       []zoneRule   `xml:"rule"`
	Forward     *struct{}    `xml:"forward"`
	Other       []xmlElement `xml:",any"`
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

func parseZone(s string) (*zone, error) {
	var z zone
	if err := xml.Unmarshal([]byte(s), &z); err != nil {
		return nil, err
	}
	return &z, nil
}

// renderZone returns kip's zone for rules: ports open to every source, rich rules for ports
// open to some sources and for trusted networks, and intra-zone forwarding, which the pod
// network needs: as the default zone, kip's zone holds every interface, flannel's and cni0
// included. Everything else gets the default target: rejected.
func renderZone(rules []Rule) *zone {
	z := &zone{Short: "Kipper", Description: FirewallMarker, Forward: &struct{}{}}
	for _, r := range rules {
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
	return z
}

// file returns the zone as firewalld reads it.
func (z *zone) file() string {
	b, err := xml.MarshalIndent(z, "", "  ")
	if err != nil {
		panic(err) // a zone's fields are strings and empty structs: it always marshals
	}
	return xml.Header + string(b) + "\n"
}

// key returns what the zone does, in a canonical form: two zones with the same key filter
// alike, however their files are laid out.
func (z *zone) key() string {
	items := []string{"target=" + z.Target, "description=" + strings.TrimSpace(z.Description), fmt.Sprint("forward=", z.Forward != nil)}
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
	return fd.running && fd.defaultZone == FirewalldZone && fd.zone != nil && fd.zone.key() == renderZone(rules).key()
}

// apply writes kip's zone and makes firewalld enforce it (see firewalld.sh). The zone opens SSH
// before firewalld starts or reloads.
func (firewalld) apply(_ *fwProbe, rules []Rule) (string, []string) {
	return firewalldScript, []string{FirewalldZone, renderZone(rules).file()}
}
