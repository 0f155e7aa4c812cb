package sshx

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

//go:embed facts.sh
var factsScript string

// Facts is what kip knows about a host after one look at it.
type Facts struct {
	OS          OS
	Kernel      string // uname -r
	Arch        string // uname -m, e.g. x86_64, aarch64
	CPUs        int
	MemTotalMiB uint64
	// Disks maps each path Facts was asked about to the file system holding it (or holding its
	// nearest existing parent, for a path that does not exist yet).
	Disks   map[string]Disk
	Addrs   []Addr  // IPv4 addresses
	Routes  []Route // IPv4 routes of the main table
	Init    string  // "systemd", or the name of process 1
	Modules map[string]ModuleState
}

// OS identifies the distribution, from os-release(5).
type OS struct {
	ID         string   // e.g. debian, ubuntu, rhel
	IDLike     []string // e.g. [debian] on Ubuntu, [rhel centos fedora] on Rocky
	VersionID  string   // e.g. 12, 24.04, 9.4
	PrettyName string
}

// Disk is a file system's size and free space.
type Disk struct {
	Mount      string
	TotalBytes uint64
	FreeBytes  uint64 // available to unprivileged users
}

// Addr is an IPv4 address on an interface, with its prefix length (e.g. 10.0.0.2/24).
type Addr struct {
	Iface string
	CIDR  netip.Prefix
}

// Route is an IPv4 route.
type Route struct {
	Type    string       // "" for an ordinary (unicast) route, else e.g. unreachable, blackhole
	Dst     netip.Prefix // 0.0.0.0/0 for the default route
	Gateway netip.Addr   // zero when the destination is on the link
	Dev     string
	Src     netip.Addr // preferred source address; may be zero
}

// IsDefault reports whether r is a default route.
func (r Route) IsDefault() bool { return r.Dst.Bits() == 0 }

// ModuleState says whether a kernel module can be used.
type ModuleState string

// The states of a kernel module.
const (
	ModuleLoaded      ModuleState = "loaded"
	ModuleLoadable    ModuleState = "loadable" // modprobe would load it
	ModuleUnavailable ModuleState = "unavailable"
)

// Usable reports whether the module is loaded or modprobe would load it.
func (s ModuleState) Usable() bool { return s == ModuleLoaded || s == ModuleLoadable }

// Facts looks at the host in one round trip: distribution, kernel, CPUs, memory, the file
// systems holding diskPaths, IPv4 addresses and routes, init system, and the kernel modules kip
// may need (wireguard, iscsi_tcp, nfs).
func (c *Client) Facts(ctx context.Context, diskPaths ...string) (*Facts, error) {
	out, err := c.Query(ctx, Command("sh", append([]string{"-c", factsScript, "kip-facts"}, diskPaths...)...))
	if err != nil {
		return nil, err
	}
	f, err := parseFacts(string(out), diskPaths)
	if err != nil {
		return nil, c.wrapErr(fmt.Errorf("read host facts: %w", err))
	}
	return f, nil
}

// parseFacts parses the output of facts.sh run with diskPaths. A section left empty (its tool is
// missing) leaves its fields zero; a section that cannot be parsed is an error.
func parseFacts(out string, diskPaths []string) (*Facts, error) {
	sections, err := Sections(out, sectionMarker, nil)
	if err != nil {
		return nil, err
	}
	blank := func(name string) bool { return strings.TrimSpace(sections[name]) == "" }
	f := &Facts{
		OS:     parseOSRelease(sections["os-release"]),
		Kernel: strings.TrimSpace(sections["kernel"]),
		Arch:   strings.TrimSpace(sections["arch"]),
		Init:   strings.TrimSpace(sections["init"]),
		Disks:  make(map[string]Disk, len(diskPaths)),
	}
	if !blank("cpus") {
		if f.CPUs, err = strconv.Atoi(strings.TrimSpace(sections["cpus"])); err != nil {
			return nil, fmt.Errorf("cpus: %w", err)
		}
	}
	if !blank("meminfo") {
		if f.MemTotalMiB, err = parseMemTotal(sections["meminfo"]); err != nil {
			return nil, fmt.Errorf("meminfo: %w", err)
		}
	}
	for i, p := range diskPaths {
		name := "df " + strconv.Itoa(i)
		if blank(name) {
			continue
		}
		if f.Disks[p], err = parseDF(sections[name]); err != nil {
			return nil, fmt.Errorf("df %s: %w", p, err)
		}
	}
	if f.Addrs, err = parseAddrs(sections["ip-addr"]); err != nil {
		return nil, fmt.Errorf("ip addr: %w", err)
	}
	if f.Routes, err = parseRoutes(sections["ip-route"]); err != nil {
		return nil, fmt.Errorf("ip route: %w", err)
	}
	if f.Modules, err = parseModules(sections["modules"]); err != nil {
		return nil, fmt.Errorf("modules: %w", err)
	}
	return f, nil
}

// sectionMarker starts a section header line in facts.sh's output.
const sectionMarker = "@@kip-facts"

// parseOSRelease reads the fields kip uses from an os-release(5) file. Lines it does not
// understand are skipped, as the format asks.
func parseOSRelease(s string) OS {
	var rel OS
	for _, line := range strings.Split(s, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		val = unquoteShell(val)
		switch key {
		case "ID":
			rel.ID = val
		case "ID_LIKE":
			rel.IDLike = strings.Fields(val)
		case "VERSION_ID":
			rel.VersionID = val
		case "PRETTY_NAME":
			rel.PrettyName = val
		}
	}
	return rel
}

// unquoteShell undoes the shell quoting os-release values may use: "..." with \", \\, \$ and \`
// escaped, or '...'.
func unquoteShell(v string) string {
	if len(v) < 2 || v[0] != v[len(v)-1] {
		return v
	}
	switch v[0] {
	case '\'':
		return v[1 : len(v)-1]
	case '"':
		var b strings.Builder
		in := v[1 : len(v)-1]
		for i := 0; i < len(in); i++ {
			if in[i] == '\\' && i+1 < len(in) && strings.IndexByte("\"\\$`", in[i+1]) >= 0 {
				i++
			}
			b.WriteByte(in[i])
		}
		return b.String()
	}
	return v
}

// parseMemTotal returns MemTotal from /proc/meminfo in MiB.
func parseMemTotal(s string) (uint64, error) {
	for _, line := range strings.Split(s, "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("unexpected MemTotal line %q", line)
		}
		kB, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("MemTotal: %w", err)
		}
		return kB / 1024, nil
	}
	return 0, errors.New("no MemTotal line")
}

// dfLine matches a line of POSIX df -Pk output: file system, 1024-blocks, used, available,
// capacity, mount point. The file system name is matched lazily: the first run of four numbers
// ends it, so names and mount points with spaces still parse.
var dfLine = regexp.MustCompile(`^(.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+%|-)\s+(/.*)$`)

// parseDF parses the output of df -Pk for one path: a header and one line.
func parseDF(s string) (Disk, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) != 2 {
		return Disk{}, fmt.Errorf("want a header and one line, got %d lines", len(lines))
	}
	m := dfLine.FindStringSubmatch(strings.TrimRight(lines[1], " \r"))
	if m == nil {
		return Disk{}, fmt.Errorf("cannot parse %q", lines[1])
	}
	total, err := kibToBytes(m[2])
	if err != nil {
		return Disk{}, err
	}
	free, err := kibToBytes(m[4])
	if err != nil {
		return Disk{}, err
	}
	return Disk{Mount: m[6], TotalBytes: total, FreeBytes: free}, nil
}

func kibToBytes(s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err == nil && n > math.MaxUint64/1024 {
		err = fmt.Errorf("%s KiB is too large", s)
	}
	return n * 1024, err
}

// parseAddrs parses the IPv4 addresses in the output of ip -j -4 addr.
func parseAddrs(s string) ([]Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ifaces []struct {
		IfName   string `json:"ifname"`
		AddrInfo []struct {
			Family    string `json:"family"`
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(s), &ifaces); err != nil {
		return nil, err
	}
	var addrs []Addr
	for _, iface := range ifaces {
		for _, ai := range iface.AddrInfo {
			if ai.Family != "inet" {
				continue
			}
			a, err := netip.ParseAddr(ai.Local)
			if err != nil || !a.Is4() {
				return nil, fmt.Errorf("%s: bad IPv4 address %q", iface.IfName, ai.Local)
			}
			p := netip.PrefixFrom(a, ai.PrefixLen)
			if !p.IsValid() {
				return nil, fmt.Errorf("%s: bad prefix length %d for %s", iface.IfName, ai.PrefixLen, a)
			}
			addrs = append(addrs, Addr{Iface: iface.IfName, CIDR: p})
		}
	}
	return addrs, nil
}

// parseRoutes parses the output of ip -j -4 route.
func parseRoutes(s string) ([]Route, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var raw []struct {
		Type    string `json:"type"`
		Dst     string `json:"dst"`
		Gateway string `json:"gateway"`
		Dev     string `json:"dev"`
		PrefSrc string `json:"prefsrc"`
	}
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return nil, err
	}
	routes := make([]Route, 0, len(raw))
	for _, r := range raw {
		dst, err := parseDst(r.Dst)
		if err != nil {
			return nil, err
		}
		route := Route{Type: r.Type, Dst: dst, Dev: r.Dev}
		if route.Gateway, err = parseOptionalAddr(r.Gateway); err != nil {
			return nil, fmt.Errorf("route to %s: gateway: %w", r.Dst, err)
		}
		if route.Src, err = parseOptionalAddr(r.PrefSrc); err != nil {
			return nil, fmt.Errorf("route to %s: source: %w", r.Dst, err)
		}
		routes = append(routes, route)
	}
	return routes, nil
}

// parseDst parses a route destination as ip prints it: "default", a prefix, or a bare address
// for a host route.
func parseDst(s string) (netip.Prefix, error) {
	if s == "default" {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0), nil
	}
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parseOptionalAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	return netip.ParseAddr(s)
}

// parseModules parses facts.sh's "module state" lines.
func parseModules(s string) (map[string]ModuleState, error) {
	mods := make(map[string]ModuleState)
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		name, state, _ := strings.Cut(line, " ")
		switch st := ModuleState(state); st {
		case ModuleLoaded, ModuleLoadable, ModuleUnavailable:
			mods[name] = st
		default:
			return nil, fmt.Errorf("unexpected line %q", line)
		}
	}
	return mods, nil
}

// NodeIP picks the address k3s registers a node with: want (the address kip reached the host
// at) when it is one of the host's IPv4 addresses, else the source address of the default route, as k3s would.
func (f *Facts) NodeIP(want string) (string, error) {
	for _, a := range f.Addrs {
		if a.CIDR.Addr().Is4() && a.CIDR.Addr().String() == want {
			return want, nil
		}
	}
	for _, r := range f.Routes {
		if r.IsDefault() && r.Src.IsValid() && r.Src.Is4() {
			return r.Src.String(), nil
		}
	}
	for _, a := range f.Addrs {
		if ip := a.CIDR.Addr(); ip.Is4() && ip.IsGlobalUnicast() {
			return ip.String(), nil
		}
	}
	return "", errors.New("the host has no IPv4 address for k3s")
}
