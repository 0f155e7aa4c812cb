package install

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/sshx"
)

//go:embed preflight.sh
var preflightScript string

// Minimums of the nano profile: "a server with 4 GB of RAM and 20 GiB of free disk space". A
// 4 GB server shows about 3900 MiB of MemTotal, so the floor leaves room for what the kernel
// and firmware keep.
const (
	MinCPUs      = 1
	MinMemoryMiB = 3500
	MinFreeBytes = 20 << 30 // on the file system holding cluster.RancherDir
)

// Longhorn's disk rule: Longhorn keeps more than LonghornReservedPercent of the file system
// holding cluster.LonghornDir free, and schedules volumes only into the space above that reserve. kip
// asks for at least LonghornMinScheduleBytes there, so that the first volumes fit.
const (
	LonghornReservedPercent  = 25
	LonghornMinScheduleBytes = 10 << 30
)

// DiskPaths are the paths whose file systems Preflight checks: gather the host's Facts with them.
var DiskPaths = []string{cluster.RancherDir, cluster.LonghornDir}

// Request is what the operator asked install for; empty fields pick the defaults.
type Request struct {
	Profile string // --profile
	Storage string // --storage
	// Recorded, on a host whose cluster has kip's record, is the recorded profile and storage:
	// preflight checks what they need, never what a new install on this host would pick.
	Recorded *cluster.Sizing
}

// Status is a check's outcome.
type Status string

// Check outcomes. A failed check stops install; a warning is printed and install goes on.
const (
	StatusOK   Status = "ok"
	StatusWarn Status = "warn"
	StatusFail Status = "fail"
)

// Check is one preflight check: what was found and, unless it passed, the fix.
type Check struct {
	Name   string
	Status Status
	Detail string
	Fix    string
}

// Report is the outcome of Preflight, its checks in the order they ran.
type Report struct {
	Host   string
	Checks []Check
	// Sizing is the profile and storage chosen; zero when the profile check failed.
	Sizing cluster.Sizing
	// ExistingK3s says a k3s is already on the host: install takes the re-run path.
	ExistingK3s bool
}

// Err returns one error naming every failed check and its fix, or nil when none failed.
func (r *Report) Err() error {
	var failed []string
	for _, c := range r.Checks {
		if c.Status != StatusFail {
			continue
		}
		s := c.Name + ": " + c.Detail
		if c.Fix != "" {
			s += " (fix: " + c.Fix + ")"
		}
		failed = append(failed, s)
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("preflight failed on %s: 1 check failed: %s", r.Host, failed[0])
	}
	return fmt.Errorf("preflight failed on %s: %d checks failed: %s", r.Host, len(failed), strings.Join(failed, "; "))
}

// probeHost reads, in one remote command, what preflight and install need beyond the host's
// facts: listening ports, another Kubernetes or CNI, the host firewall, and k3s's state.
// evaluate then runs the checks on it, once install knows what the host is to get.
func probeHost(ctx context.Context, c *sshx.Client) (*probe, error) {
	out, err := c.Output(ctx, sshx.Command("sh", "-c", preflightScript, "kip-preflight", host.FirewalldZone))
	if err != nil {
		return nil, fmt.Errorf("preflight: %w", err)
	}
	p, err := parseProbe(string(out))
	if err != nil {
		return nil, fmt.Errorf("preflight on %s: read the host's state: %w", c, err)
	}
	p.sshPort = c.Port()
	return p, nil
}

// evaluate runs every check on what was found on the host.
func evaluate(hostName string, f *sshx.Facts, p *probe, want Request) *Report {
	r := &Report{Host: hostName}
	add := func(c Check) { r.Checks = append(r.Checks, c) }

	family, famErr := host.Identify(f.OS)
	add(checkOS(f.OS, famErr))
	add(checkIPv4(f))
	add(checkCPUs(f.CPUs))
	add(checkMemory(f.MemTotalMiB))
	add(checkDisk(f.Disks))

	storage := want.Storage
	sizing, err := cluster.Choose(int(min(f.MemTotalMiB, math.MaxInt32)), f.CPUs, want.Profile, want.Storage)
	if want.Recorded != nil {
		sizing, err = *want.Recorded, nil
	}
	if err != nil {
		detail, fix := splitFix(err)
		add(Check{Name: "profile", Status: StatusFail, Detail: detail, Fix: fix})
	} else {
		r.Sizing, storage = sizing, sizing.Storage
		add(Check{Name: "profile", Status: StatusOK,
			Detail: fmt.Sprintf("%s (%s); storage %s (%s)", sizing.Profile.Name, sizing.ProfileReason, sizing.Storage, sizing.StorageReason)})
	}
	if storage == cluster.StorageLonghorn {
		add(checkLonghornDisk(f.Disks))
		os := checkLonghornOS(f.OS, f.Kernel)
		if want.Recorded != nil && os.Status == StatusFail {
			// The cluster already runs Longhorn here: say so, but a re-run changes nothing of it.
			os.Status = StatusWarn
		}
		add(os)
	}
	add(checkWireGuard(f.Modules["wireguard"]))
	if storage == cluster.StorageLonghorn {
		add(checkStorageModules(f.Modules, f.OS, f.Kernel))
	}
	r.ExistingK3s = p.existingK3s()
	ports := neededPorts(f.Modules["wireguard"].Usable())
	add(checkPorts(p, ports))
	add(checkKubernetes(p))
	add(checkFirewall(p, family, famErr))
	return r
}

// splitFix splits a refusal "what and why: the fix" at its last ": ".
func splitFix(err error) (detail, fix string) {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[:i], msg[i+2:]
	}
	return msg, ""
}

func checkOS(os sshx.OS, famErr error) Check {
	c := Check{Name: "os"}
	name := os.PrettyName
	if name == "" {
		name = strings.TrimSpace(os.ID + " " + os.VersionID)
	}
	if famErr != nil {
		c.Status, c.Detail, c.Fix = StatusFail, famErr.Error(), "reinstall the host with a supported release"
		return c
	}
	c.Status, c.Detail = StatusOK, name
	return c
}

func checkIPv4(f *sshx.Facts) Check {
	c := Check{Name: "ipv4", Status: StatusFail,
		Fix: "give the host an IPv4 address and a default route through it: k3s and kip need IPv4"}
	for _, rt := range f.Routes {
		if rt.Type != "" || !rt.IsDefault() {
			continue
		}
		for _, a := range f.Addrs {
			if a.Iface != rt.Dev || (rt.Src.IsValid() && a.CIDR.Addr() != rt.Src) {
				continue
			}
			via := "on the link"
			if rt.Gateway.IsValid() {
				via = "via " + rt.Gateway.String()
			}
			return Check{Name: "ipv4", Status: StatusOK, Detail: fmt.Sprintf("%s on %s, default route %s", a.CIDR.Addr(), a.Iface, via)}
		}
		c.Detail = fmt.Sprintf("the default route goes through %s, which has no IPv4 address", rt.Dev)
		return c
	}
	if len(f.Addrs) == 0 {
		c.Detail = "no IPv4 address"
	} else {
		c.Detail = "no IPv4 default route"
	}
	return c
}

func checkCPUs(cpus int) Check {
	if cpus < MinCPUs {
		return Check{Name: "cpu", Status: StatusFail, Detail: fmt.Sprintf("no CPU seen (nproc printed %d); kip needs at least %d", cpus, MinCPUs),
			Fix: "give the server at least 1 CPU"}
	}
	if cpus == 1 {
		return Check{Name: "cpu", Status: StatusOK, Detail: "1 CPU"}
	}
	return Check{Name: "cpu", Status: StatusOK, Detail: fmt.Sprintf("%d CPUs", cpus)}
}

func checkMemory(mib uint64) Check {
	if mib < MinMemoryMiB {
		return Check{Name: "memory", Status: StatusFail,
			Detail: fmt.Sprintf("%d MiB of RAM; the nano profile needs at least %d MiB (a 4 GB server)", mib, MinMemoryMiB),
			Fix:    "resize the server to at least 4 GB of RAM"}
	}
	return Check{Name: "memory", Status: StatusOK, Detail: fmt.Sprintf("%d MiB of RAM", mib)}
}

func checkDisk(disks map[string]sshx.Disk) Check {
	d, ok := disks[cluster.RancherDir]
	if !ok {
		return Check{Name: "disk", Status: StatusFail, Detail: "cannot see the free space of the file system holding " + cluster.RancherDir,
			Fix: "check that df works on the host"}
	}
	if d.FreeBytes < MinFreeBytes {
		return Check{Name: "disk", Status: StatusFail,
			Detail: fmt.Sprintf("%s free on %s (holding %s); kip needs at least %s", gib(d.FreeBytes), d.Mount, cluster.RancherDir, gib(MinFreeBytes)),
			Fix:    fmt.Sprintf("free or add space on %s until %s is free", d.Mount, gib(MinFreeBytes))}
	}
	return Check{Name: "disk", Status: StatusOK, Detail: fmt.Sprintf("%s free on %s (holding %s)", gib(d.FreeBytes), d.Mount, cluster.RancherDir)}
}

func checkLonghornDisk(disks map[string]sshx.Disk) Check {
	c := Check{Name: "longhorn disk"}
	d, ok := disks[cluster.LonghornDir]
	if !ok {
		c.Status, c.Detail, c.Fix = StatusFail, "cannot see the free space of the file system holding "+cluster.LonghornDir, "check that df works on the host"
		return c
	}
	reserve := d.TotalBytes / 100 * LonghornReservedPercent
	var usable uint64
	if d.FreeBytes > reserve {
		usable = d.FreeBytes - reserve
	}
	c.Detail = fmt.Sprintf("%s free of %s on %s (holding %s); Longhorn keeps more than %d%% (%s) free, leaving %s for volumes",
		gib(d.FreeBytes), gib(d.TotalBytes), d.Mount, cluster.LonghornDir, LonghornReservedPercent, gib(reserve), gib(usable))
	if usable < LonghornMinScheduleBytes {
		c.Status = StatusFail
		c.Detail += fmt.Sprintf("; kip needs at least %s above that reserve", gib(LonghornMinScheduleBytes))
		c.Fix = fmt.Sprintf("give %s a larger disk, or install with local storage (omit --storage)", d.Mount)
		return c
	}
	c.Status = StatusOK
	return c
}

func checkLonghornOS(os sshx.OS, kernel string) Check {
	if err := host.CheckLonghorn(os, kernel); err != nil {
		return Check{Name: "longhorn os", Status: StatusFail, Detail: err.Error(),
			Fix: host.LonghornOSFix + "; or install with local storage (omit --storage)"}
	}
	return Check{Name: "longhorn os", Status: StatusOK, Detail: "Longhorn runs on this OS and kernel"}
}

func checkWireGuard(s sshx.ModuleState) Check {
	if s.Usable() {
		return Check{Name: "wireguard", Status: StatusOK, Detail: "pod network: WireGuard"}
	}
	return Check{Name: "wireguard", Status: StatusWarn,
		Detail: "the wireguard module cannot load: the pod network falls back to VXLAN, and kip node add will need wireguard",
		Fix:    host.WireGuardFix + " before adding nodes"}
}

func checkStorageModules(mods map[string]sshx.ModuleState, os sshx.OS, kernel string) Check {
	missing, fix := host.MissingStorageModules(mods, os, kernel)
	if len(missing) == 0 {
		return Check{Name: "storage modules", Status: StatusOK, Detail: "iscsi_tcp and nfs can load"}
	}
	return Check{Name: "storage modules", Status: StatusFail,
		Detail: "Longhorn needs the " + strings.Join(missing, " and ") + " kernel module(s), which cannot load",
		Fix:    fix + ", or install with local storage (omit --storage)"}
}

// portRange is ports k3s needs free on the server.
type portRange struct {
	proto     string
	from, to  uint16
	forWhat   string
	wireGuard bool // only with the WireGuard pod network
	vxlan     bool // only with the VXLAN pod network
}

var k3sPorts = []portRange{
	{proto: "tcp", from: 6443, to: 6443, forWhat: "the Kubernetes API"},
	{proto: "tcp", from: 10250, to: 10250, forWhat: "the kubelet"},
	{proto: "tcp", from: 2379, to: 2380, forWhat: "etcd"},
	{proto: "udp", from: 51820, to: 51820, forWhat: "the WireGuard pod network", wireGuard: true},
	{proto: "udp", from: 8472, to: 8472, forWhat: "the VXLAN pod network", vxlan: true},
}

// k3sProcesses are the names a k3s's own processes show.
var k3sProcesses = []string{"k3s", "k3s-server", "k3s-agent", "containerd"}

// neededPorts returns the ports k3s needs with the pod network the host can have.
func neededPorts(wireGuard bool) []portRange {
	var rs []portRange
	for _, r := range k3sPorts {
		if (r.wireGuard && !wireGuard) || (r.vxlan && wireGuard) {
			continue
		}
		rs = append(rs, r)
	}
	return rs
}

func checkPorts(p *probe, ports []portRange) Check {
	c := Check{Name: "ports"}
	if !p.has["ports"] {
		c.Status, c.Detail, c.Fix = StatusWarn, "cannot see listening ports: ss is missing", "install iproute2"
		return c
	}
	var busy []string
	for _, r := range ports {
		for _, l := range p.listeners {
			if l.Proto != r.proto || l.Port < r.from || l.Port > r.to {
				continue
			}
			if p.existingK3s() && (slices.Contains(k3sProcesses, l.Process) || slices.Contains(p.k3sPIDs, l.PID)) {
				continue // the existing k3s's own: the re-run path replaces it
			}
			by := "an unknown process"
			if l.Process != "" {
				by = l.Process
			}
			busy = append(busy, fmt.Sprintf("%d/%s (%s) is in use by %s", l.Port, l.Proto, r.forWhat, by))
		}
	}
	if len(busy) > 0 {
		c.Status, c.Detail = StatusFail, strings.Join(slices.Compact(busy), "; ")
		c.Fix = "stop the process holding the port, or use another host"
		return c
	}
	c.Status, c.Detail = StatusOK, "free: "+strings.Join(portNames(ports), ", ")
	return c
}

func (r portRange) String() string {
	if r.from == r.to {
		return fmt.Sprintf("%d/%s", r.from, r.proto)
	}
	return fmt.Sprintf("%d-%d/%s", r.from, r.to, r.proto)
}

func checkKubernetes(p *probe) Check {
	c := Check{Name: "kubernetes"}
	if found := p.foreign(); len(found) > 0 {
		c.Status = StatusFail
		c.Detail = "another Kubernetes or CNI is on the host: " + strings.Join(found, ", ")
		c.Fix = "kip installs k3s on a host without another Kubernetes: remove it (for kubeadm, kubeadm reset; remove Docker or containerd and the files under /etc/cni/net.d), or use a fresh host"
		return c
	}
	if p.existingK3s() {
		c.Status, c.Detail = StatusOK, "existing k3s ("+strings.Join(p.k3sSigns(), ", ")+"): install takes the re-run path"
		return c
	}
	c.Status, c.Detail = StatusOK, "no other Kubernetes or CNI"
	return c
}

func checkFirewall(p *probe, family host.Family, famErr error) Check {
	c := Check{Name: "firewall", Status: StatusOK}
	rules := host.ServerRules(cmp.Or(p.sshPort, 22))
	active := ""
	if p.firewall.Active {
		active = p.firewall.Tool
	}
	off := map[string]string{"ufw": "ufw disable", "firewalld": "systemctl disable --now firewalld"}[active]
	switch {
	case active == "":
		c.Detail = "no active host firewall"
		if famErr == nil {
			c.Detail += "; kip will manage " + family.Firewall
		}
	case p.firewall.Managed:
		c.Detail = active + " is active and managed by kip"
	case active == "ufw":
		blocks, err := host.UfwBlocks(p.ufwStatus, p.ufwAdded, rules)
		switch {
		case err != nil:
			c.Status, c.Detail, c.Fix = StatusWarn, "ufw is active and not managed by kip, and kip cannot read its rules ("+err.Error()+")",
				"make sure it lets in "+host.Describe(rules)
		case len(blocks) > 0:
			// Refused now: otherwise the install changes the host and waits minutes for an API
			// that the firewall keeps out.
			c.Status = StatusFail
			c.Detail = "ufw is active, not managed by kip, and does not let in what the cluster needs (" + host.Describe(rules) + ")"
			c.Fix = "on the server run: " + strings.Join(blocks, " && ") + "; or turn ufw off (" + off + ") so that kip manages it; then run kip install again"
		default:
			c.Detail = "ufw is active and not managed by kip: left alone; it lets in what the cluster needs"
		}
	default:
		c.Status = StatusWarn
		c.Detail = active + " is active and not managed by kip: left alone; kip cannot read its rules"
		c.Fix = "make sure it lets in " + host.Describe(rules) + ", or turn it off (" + off + ") and run kip install again to let kip manage it"
	}
	return c
}

func portNames(ports []portRange) []string {
	var s []string
	for _, r := range ports {
		s = append(s, r.String())
	}
	return s
}

// gib formats a byte count in GiB, rounded down to a tenth so that 20 GiB less a byte does not
// print as 20.0.
func gib(b uint64) string {
	return strconv.FormatFloat(math.Floor(float64(b)/(1<<30)*10)/10, 'f', 1, 64) + " GiB"
}

// probe is what preflight.sh found.
type probe struct {
	has       map[string]bool // sections with any output
	listeners []listener
	k3sPIDs   []int // processes of k3s's units
	processes []string
	paths     []string
	cni       []string // files in /etc/cni/net.d
	firewall  host.FirewallState
	// ufwStatus and ufwAdded are ufw's own words, for host.UfwBlocks.
	ufwStatus, ufwAdded string
	// sshPort is the port kip reached the host on (0: 22), which the firewall must keep open.
	sshPort int
	// state is what install needs to know of k3s and an unfinished install, read in the same
	// round trip.
	state hostState
}

// k3sSigns returns what shows an existing k3s.
func (p *probe) k3sSigns() []string {
	var s []string
	for _, x := range p.paths {
		if x == "/etc/rancher/k3s" || x == "/usr/local/bin/k3s" {
			s = append(s, x)
		}
	}
	for _, x := range p.processes {
		if strings.HasPrefix(x, "k3s") {
			s = append(s, "process "+x)
		}
	}
	return s
}

func (p *probe) existingK3s() bool { return len(p.k3sSigns()) > 0 }

// foreign returns the signs of a Kubernetes or CNI that is not a k3s kip can take over.
func (p *probe) foreign() []string {
	k3s := p.existingK3s()
	var s []string
	for _, x := range p.processes {
		switch {
		case strings.HasPrefix(x, "k3s"):
		case x == "containerd" && k3s: // k3s runs its own containerd
		default:
			s = append(s, "process "+x)
		}
	}
	for _, x := range p.paths {
		switch {
		case x == "/etc/rancher/k3s" || x == "/usr/local/bin/k3s":
		case x == "/var/lib/kubelet" && k3s: // k3s keeps pods there too
		default:
			s = append(s, x)
		}
	}
	for _, x := range p.cni {
		s = append(s, "/etc/cni/net.d/"+x)
	}
	return s
}

// probeSections are the sections preflight.sh prints, each exactly once.
var probeSections = []string{"ports", "k3s-pids", "processes", "paths", "cni", "ufw", "ufw-added", "firewalld", "firewalld-zone",
	"k3s-version", "server-data", "k3s-unit", "intent"}

const probeMarker = "@@kip-preflight"

// parseProbe parses preflight.sh's output.
func parseProbe(out string) (*probe, error) {
	sections, err := sshx.Sections(out, probeMarker, probeSections)
	if err != nil {
		return nil, err
	}
	p := &probe{has: make(map[string]bool)}
	for name, body := range sections {
		p.has[name] = strings.TrimSpace(body) != ""
	}
	if p.listeners, err = parseListeners(sections["ports"]); err != nil {
		return nil, fmt.Errorf("ports: %w", err)
	}
	for _, l := range sshx.Lines(sections["k3s-pids"]) {
		pid, err := strconv.Atoi(l)
		if err != nil {
			return nil, fmt.Errorf("k3s-pids: %q is not a process ID", l)
		}
		p.k3sPIDs = append(p.k3sPIDs, pid)
	}
	p.processes = sshx.Lines(sections["processes"])
	p.paths = sshx.Lines(sections["paths"])
	p.cni = sshx.Lines(sections["cni"])
	p.ufwStatus, p.ufwAdded = sections["ufw"], sections["ufw-added"]
	if p.firewall, err = host.ParseFirewall(sections["ufw"], sections["ufw-added"], sections["firewalld"], sections["firewalld-zone"]); err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	p.state = hostState{
		k3sVersion: k3s.ParseVersion(sections["k3s-version"]),
		serverData: strings.TrimSpace(sections["server-data"]) == "yes",
		unit:       parseUnit(sections["k3s-unit"]),
		firewall:   p.firewall,
	}
	if p.state.intent, err = parseIntent(sections["intent"]); err != nil {
		return nil, err
	}
	return p, nil
}

// listener is a listening socket.
type listener struct {
	Proto   string // tcp or udp
	Addr    string // as ss prints it, e.g. 0.0.0.0, [::], 127.0.0.53%lo, *
	Port    uint16
	Process string // the first process holding it; "" when ss did not say
	PID     int    // its process ID; 0 when ss did not say
}

var (
	ssProcess = regexp.MustCompile(`users:\(\("((?:[^"\\]|\\.)*)"`)
	ssPID     = regexp.MustCompile(`,pid=(\d+),`)
)

// parseListeners parses the output of ss -Hltnup: netid, state, receive and send queues, local
// address:port, peer address:port and, as root, the processes holding the socket.
func parseListeners(s string) ([]listener, error) {
	var ls []listener
	for _, line := range sshx.Lines(s) {
		f := strings.Fields(line)
		if len(f) < 6 {
			return nil, fmt.Errorf("cannot parse %q", line)
		}
		proto := f[0]
		if proto != "tcp" && proto != "udp" {
			return nil, fmt.Errorf("unexpected protocol in %q", line)
		}
		i := strings.LastIndexByte(f[4], ':')
		if i < 0 {
			return nil, fmt.Errorf("no port in %q", line)
		}
		port, err := strconv.ParseUint(f[4][i+1:], 10, 16)
		if err != nil {
			return nil, fmt.Errorf("bad port in %q", line)
		}
		l := listener{Proto: proto, Addr: f[4][:i], Port: uint16(port)}
		users := strings.Join(f[6:], " ")
		if m := ssProcess.FindStringSubmatch(users); m != nil {
			l.Process = m[1]
		}
		if m := ssPID.FindStringSubmatch(users); m != nil {
			l.PID, _ = strconv.Atoi(m[1])
		}
		ls = append(ls, l)
	}
	return ls, nil
}
