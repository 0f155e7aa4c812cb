package status

import (
	"cmp"
	"context"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/sshx"
)

//go:embed hostchecks.sh
var hostScript string

// Where k3s keeps what the host checks read.
const (
	// ServerTLSDir holds the server's certificates (*.crt), which k3s issues for a year and renews
	// when it starts close to their expiry.
	ServerTLSDir = "/var/lib/rancher/k3s/server/tls"
	// AgentDir holds every node's agent certificates (*.crt), which last a year.
	AgentDir = "/var/lib/rancher/k3s/agent"
)

// hostPaths are the directories the host checks read; tests point them elsewhere.
type hostPaths struct {
	serverTLS, agent, storage string
}

var k3sPaths = hostPaths{serverTLS: ServerTLSDir, agent: AgentDir, storage: cluster.LocalStorageDir}

// Timeouts of the host checks.
const (
	// dialTimeout bounds connecting to one host, retries included.
	dialTimeout = 20 * time.Second
	// hostTimeout bounds everything run on one host (du of large volumes takes a while).
	hostTimeout = 2 * time.Minute
	// hostParallel is how many hosts are inspected at once.
	hostParallel = 4
)

// target is a host to inspect.
type target struct {
	node   string // the Node's name; "" when the API named none (the server from the saved cluster)
	addr   string // where to reach it over SSH
	server bool
}

// label names the target in messages: its node name and address.
func (t target) label() string {
	switch {
	case t.node == "":
		return "the server (" + t.addr + ")"
	case t.node == t.addr:
		return t.node
	}
	return t.node + " (" + t.addr + ")"
}

// inspection is what one host showed.
type inspection struct {
	target   target
	dialErr  error // the host could not be reached: nothing else is set
	facts    *sshx.Facts
	factsErr error
	probe    *probe
	probeErr error
	fw       host.FirewallState
	fwErr    error
	sshPort  int // the port SSH reached the host on
}

// hostRequest says what to read on each host.
type hostRequest struct {
	facts    []string // disk paths for Facts; nil skips Facts
	probe    func(t target) []string
	firewall bool
}

// inspectHosts reads every target over its own connection, a few hosts at a time, and each
// host's facts, probe and firewall at once over that connection.
func inspectHosts(ctx context.Context, dial DialFunc, targets []target, req hostRequest) []inspection {
	out := make([]inspection, len(targets))
	sem := make(chan struct{}, hostParallel)
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i] = inspectHost(ctx, dial, t, req)
		})
	}
	wg.Wait()
	return out
}

func inspectHost(ctx context.Context, dial DialFunc, t target, req hostRequest) inspection {
	in := inspection{target: t}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	c, err := dial(dctx, t.addr)
	cancel()
	if err != nil {
		in.dialErr = err
		return in
	}
	in.sshPort = c.Port()
	ctx, cancel = context.WithTimeout(ctx, hostTimeout)
	defer cancel()
	var wg sync.WaitGroup
	if req.facts != nil {
		wg.Go(func() { in.facts, in.factsErr = c.Facts(ctx, req.facts...) })
	}
	if req.probe != nil {
		if args := req.probe(t); len(args) > 0 {
			wg.Go(func() { in.probe, in.probeErr = runProbe(ctx, c, args) })
		}
	}
	if req.firewall {
		wg.Go(func() { in.fw, in.fwErr = host.ReadFirewall(ctx, c) })
	}
	wg.Wait()
	return in
}

// doctorArgs are hostchecks.sh's arguments for doctor on t: the clock first, then k3s's unit,
// then the certificates, the server's only on a server.
func (p hostPaths) doctorArgs(t target) []string {
	args := []string{"clock", unitArg(t.server)}
	if t.server {
		args = append(args, "certs="+p.serverTLS)
	}
	return append(args, "certs="+p.agent)
}

// probe is what hostchecks.sh printed, and when.
type probe struct {
	// sent and received bracket the command on this machine's clock; clock is the host's,
	// read in between. hasClock is false when it was not asked for.
	sent, received time.Time
	clock          time.Time
	hasClock       bool
	certs          []certFile
	volumes        []dirUsage
	hasVolumes     bool
	// unit is k3s's systemd unit, when asked for.
	unit *Unit
}

// certFile is one certificate file and what it holds.
type certFile struct {
	path  string
	certs []*x509.Certificate
	err   error // the file holds no certificate kip can read
}

// dirUsage is the disk space a directory uses.
type dirUsage struct {
	path  string
	bytes int64
}

// runProbe runs hostchecks.sh with args in one round trip.
func runProbe(ctx context.Context, c *sshx.Client, args []string) (*probe, error) {
	cmd := sshx.Command("sh", append([]string{"-c", hostScript, "kip-host"}, args...)...)
	sent := time.Now()
	out, err := c.Output(ctx, cmd)
	received := time.Now()
	if err != nil {
		return nil, err
	}
	p, err := parseProbe(string(out))
	if err != nil {
		return nil, fmt.Errorf("read host checks from %s: %w", c, err)
	}
	p.sent, p.received = sent, received
	return p, nil
}

const probeMarker = "\n@@kip-host "

// parseProbe parses hostchecks.sh's output. Whatever precedes the first header (a login banner)
// is ignored.
func parseProbe(out string) (*probe, error) {
	parts := strings.Split(out, probeMarker)
	p := &probe{}
	var unitShow string
	for _, part := range parts[1:] {
		name, body, _ := strings.Cut(part, "\n")
		switch {
		case strings.HasPrefix(name, "unit "):
			unitShow = body
		case strings.HasPrefix(name, "journal "):
			p.unit = parseUnit(strings.TrimPrefix(name, "journal "), unitShow, body)
		case name == "clock":
			t, err := parseClock(body)
			if err != nil {
				return nil, err
			}
			p.clock, p.hasClock = t, true
		case strings.HasPrefix(name, "cert "):
			path := strings.TrimPrefix(name, "cert ")
			certs, err := parseCerts([]byte(body))
			p.certs = append(p.certs, certFile{path: path, certs: certs, err: err})
		case name == "volumes":
			vols, err := parseDU(body)
			if err != nil {
				return nil, err
			}
			p.volumes, p.hasVolumes = vols, true
		default:
			return nil, fmt.Errorf("unexpected section %q", name)
		}
	}
	return p, nil
}

// parseClock reads date +%s.%N. A date without %N prints it as it is, or drops it: the seconds
// are still right.
func parseClock(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	secs, frac, _ := strings.Cut(s, ".")
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("clock: cannot read %q", s)
	}
	var nanos int64
	if frac != "" && len(frac) <= 9 && strings.Trim(frac, "0123456789") == "" {
		nanos, _ = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	return time.Unix(n, nanos), nil
}

// parseCerts reads every certificate in a PEM file.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate in the file")
	}
	return certs, nil
}

// parseDU reads du -sk lines: KiB, a tab, the path.
func parseDU(s string) ([]dirUsage, error) {
	var out []dirUsage
	for _, line := range strings.Split(s, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		kib, path, ok := strings.Cut(line, "\t")
		n, err := strconv.ParseInt(kib, 10, 64)
		if !ok || err != nil || n < 0 {
			return nil, fmt.Errorf("volumes: cannot read %q", line)
		}
		out = append(out, dirUsage{path: strings.TrimSuffix(path, "/"), bytes: n * 1024})
	}
	return out, nil
}

// Clock skew thresholds. kip's cluster lock is stale a minute after its holder's last renewal,
// judged by the clock of the kip that finds it (docs/records.md), so operators' clocks must
// roughly agree; certificate validity and backup expiry are judged by clocks too.
const (
	// ClockSkewWarn is the skew from which doctor warns.
	ClockSkewWarn = 5 * time.Second
	// ClockSkewFail is the skew from which doctor fails: half the lock's minute, beyond which a
	// kip could take the lock from a holder that still renews it.
	ClockSkewFail = 30 * time.Second
)

// checkClock judges the skew of another clock (whose, e.g. "the API server's") against this
// machine's, measured to within uncertainty.
func checkClock(node, whose string, skew, uncertainty time.Duration) Check {
	c := Check{Name: "clock", Node: node, Status: StatusOK}
	dir := "ahead of"
	if skew < 0 {
		dir = "behind"
	}
	abs := skew.Abs()
	c.Detail = fmt.Sprintf("%s clock is %s %s this machine's (±%s)", whose, durationText(abs), dir, durationText(uncertainty))
	c.ClockSkewSeconds, c.ClockUncertaintySeconds = seconds(skew), seconds(uncertainty)
	// Only a skew the measurement cannot explain counts.
	sure := abs - uncertainty
	const fix = "turn on time synchronisation on both (timedatectl set-ntp true, or chrony/ntpd)"
	switch {
	case sure > ClockSkewFail:
		c.Status = StatusFail
		c.Detail += fmt.Sprintf(": more than %s apart, a kip can take the cluster lock from a command that still holds it, and certificates look valid or expired at the wrong time", ClockSkewFail)
		c.Fix = fix
	case sure > ClockSkewWarn:
		c.Status = StatusWarn
		c.Detail += fmt.Sprintf(": more than %s apart; kip's cluster lock relies on clocks that roughly agree", ClockSkewWarn)
		c.Fix = fix
	}
	return c
}

// durationText rounds a duration the way people read it: 312ms, 4.2s, 4m59s, 5m, 2h5m.
func durationText(d time.Duration) string {
	switch abs := d.Abs(); {
	case abs < time.Second:
		d = d.Round(time.Millisecond)
	case abs < time.Minute:
		d = d.Round(100 * time.Millisecond)
	case abs < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// seconds is d in seconds, to the millisecond.
func seconds(d time.Duration) *float64 {
	s := float64(d.Round(time.Millisecond)) / float64(time.Second)
	return &s
}

// clockSkew is the host's clock minus this machine's at the moment the host read it, taken as
// the midpoint of the round trip, and the uncertainty of that: half the round trip, plus a
// second when the host's date printed whole seconds only.
func (p *probe) clockSkew() (skew, uncertainty time.Duration) {
	rtt := p.received.Sub(p.sent)
	mid := p.sent.Add(rtt / 2)
	uncertainty = rtt / 2
	if p.clock.Nanosecond() == 0 {
		uncertainty += time.Second
	}
	return p.clock.Sub(mid), uncertainty
}

// CertWarnBefore is how long before a certificate's expiry doctor warns.
const CertWarnBefore = 30 * 24 * time.Hour

// certExpiry is the certificate of a file that expires first.
type certExpiry struct {
	path     string
	subject  string
	notAfter time.Time
	ca       bool
}

// firstExpiry returns the certificate of f that expires first.
func firstExpiry(f certFile) certExpiry {
	e := certExpiry{path: f.path}
	for _, c := range f.certs {
		if e.notAfter.IsZero() || c.NotAfter.Before(e.notAfter) {
			e.notAfter, e.subject, e.ca = c.NotAfter, c.Subject.CommonName, c.IsCA
		}
	}
	return e
}

// checkCerts judges a node's certificate files at now: expired ones fail, ones expiring within
// CertWarnBefore warn. On a server, files under serverTLS are the server's; the rest are the
// agent's, which every node has.
func checkCerts(t target, serverTLS string, files []certFile, now time.Time) Check {
	c := Check{Name: "certificates", Node: t.node, Status: StatusOK}
	var expired, soon, unreadable []string
	var serverHit, agentHit, caHit bool
	var first certExpiry
	var haveServer, haveAgent bool
	for _, f := range files {
		server := strings.HasPrefix(f.path, serverTLS+"/")
		if server {
			haveServer = true
		} else {
			haveAgent = true
		}
		if f.err != nil {
			unreadable = append(unreadable, fmt.Sprintf("%s (%v)", f.path, f.err))
			continue
		}
		e := firstExpiry(f)
		if first.notAfter.IsZero() || e.notAfter.Before(first.notAfter) {
			first = e
		}
		var list *[]string
		switch {
		case !now.Before(e.notAfter):
			list = &expired
		case e.notAfter.Sub(now) < CertWarnBefore:
			list = &soon
		default:
			continue
		}
		*list = append(*list, fmt.Sprintf("%s (%s) on %s", f.path, e.subject, day(e.notAfter)))
		serverHit = serverHit || server
		agentHit = agentHit || !server
		caHit = caHit || e.ca
	}
	where := t.label()
	switch {
	case t.server && !haveServer:
		c.Status, c.Detail = StatusFail, fmt.Sprintf("no server certificates in %s on %s: is k3s installed there?", serverTLS, where)
		c.Fix = "check k3s on the server: systemctl status k3s; journalctl -u k3s"
		return c
	case !haveAgent:
		c.Status, c.Detail = StatusFail, fmt.Sprintf("no agent certificates on %s: a node whose certificates are missing shows NotReady", where)
		c.Fix = rejoinFix(t)
		return c
	case len(expired) > 0:
		c.Status = StatusFail
		c.Detail = "expired: " + strings.Join(expired, ", ")
		if len(soon) > 0 {
			c.Detail += "; expiring within 30 days: " + strings.Join(soon, ", ")
		}
		c.Fix = expiredFix(t, serverHit, agentHit)
	case len(soon) > 0:
		c.Status = StatusWarn
		c.Detail = "expiring within 30 days: " + strings.Join(soon, ", ")
		c.Fix = renewFix(t)
	default:
		c.Detail = fmt.Sprintf("%d certificate files valid; the first to expire is %s on %s (in %d days)",
			len(files)-len(unreadable), first.path, day(first.notAfter), int(first.notAfter.Sub(now).Hours()/24))
	}
	if caHit {
		c.Fix += "; k3s does not renew its CA certificates by itself: rotate them with 'k3s certificate rotate-ca' (see the k3s documentation)"
	}
	if len(unreadable) > 0 {
		if c.Status == StatusOK {
			c.Status = StatusWarn
			c.Fix = "look at the files: k3s rewrites them when it starts"
		}
		c.Detail += "; unreadable: " + strings.Join(unreadable, ", ")
	}
	return c
}

func day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// renewFix renews certificates that are still valid: k3s renews those close to expiry (within
// 120 days) each time it starts.
func renewFix(t target) string {
	if t.server {
		return "restart k3s on the server while the certificates are still valid (systemctl restart k3s): k3s renews certificates close to expiry each time it starts"
	}
	return fmt.Sprintf("reboot the worker while its certificates are still valid: kip node reboot %s (its agent renews them when it starts)", t.node)
}

// expiredFix renews expired certificates.
func expiredFix(t target, server, agent bool) string {
	switch {
	case t.server && server:
		return "on the server: systemctl stop k3s && k3s certificate rotate && systemctl start k3s"
	case t.server && agent:
		return "restart k3s on the server (systemctl restart k3s): the server issues its own agent certificates again when it starts"
	}
	return rejoinFix(t)
}

func rejoinFix(t target) string {
	if t.server {
		return "check k3s on the server: systemctl status k3s; journalctl -u k3s"
	}
	return fmt.Sprintf("run 'kip node add %s' again with the original options: it rejoins the worker and keeps its name and data", t.addr)
}

// Disk thresholds of the file system holding k3s's data. The kubelet evicts pods when its file
// system has less than 10% free (nodefs.available<10%) and removes images below 15%
// (imagefs.available<15%); local volumes share that file system.
const (
	// DiskLowBytes: warn below this much free space.
	DiskLowBytes = 5 << 30
	// DiskLowPercent: warn below this share free.
	DiskLowPercent = 15
	// DiskFullPercent: doctor fails below this share free: the kubelet is evicting pods.
	DiskFullPercent = 10
)

// diskLevel says how full a file system is: StatusOK, StatusWarn (below DiskLowBytes or
// DiskLowPercent free) or StatusFail (below DiskFullPercent free).
func diskLevel(total, free uint64) CheckStatus {
	switch {
	case total == 0:
		return StatusOK
	case free*100 < total*DiskFullPercent:
		return StatusFail
	case free < DiskLowBytes || free*100 < total*DiskLowPercent:
		return StatusWarn
	}
	return StatusOK
}

// checkHostDisk judges the file systems holding paths on a node.
func checkHostDisk(node string, disks map[string]sshx.Disk, paths []string) Check {
	c := Check{Name: "disk", Node: node, Status: StatusOK}
	var parts []string
	var mounts []string
	for _, p := range paths {
		d, ok := disks[p]
		if !ok || slices.Contains(mounts, d.Mount) {
			continue
		}
		mounts = append(mounts, d.Mount)
		level := diskLevel(d.TotalBytes, d.FreeBytes)
		parts = append(parts, fmt.Sprintf("%s free of %s on %s (holding %s)", cli.FormatBytes(int64(d.FreeBytes)), cli.FormatBytes(int64(d.TotalBytes)), d.Mount, p))
		switch {
		case level == StatusFail:
			c.Status = StatusFail
			c.Fix = fmt.Sprintf("free space on %s now: below %d%% free the kubelet evicts pods (delete unused images with 'k3s crictl rmi --prune', old volumes, logs), or grow the disk", d.Mount, DiskFullPercent)
		case level == StatusWarn && c.Status == StatusOK:
			c.Status = StatusWarn
			c.Fix = fmt.Sprintf("free space on %s or grow the disk before it drops below %d%%, where the kubelet evicts pods", d.Mount, DiskFullPercent)
		}
	}
	if len(parts) == 0 {
		c.Status, c.Detail, c.Fix = StatusWarn, "df did not report the file system holding "+strings.Join(paths, " and "), "check that df works on the node"
		return c
	}
	c.Detail = strings.Join(parts, "; ")
	return c
}

// checkWireGuard judges whether the node can carry the pod network the cluster runs.
func checkWireGuard(node string, state sshx.ModuleState, network string) Check {
	c := Check{Name: "wireguard", Node: node, Status: StatusOK}
	usable := state.Usable()
	switch {
	case usable && network == cluster.NetworkVXLAN:
		c.Detail = "the wireguard module can load; the pod network still runs VXLAN, as recorded: re-running kip install keeps it, and no kip command moves it to WireGuard yet"
	case usable:
		c.Detail = "the wireguard module is " + string(state)
	case network == cluster.NetworkWireGuard:
		c.Status = StatusFail
		c.Detail = "the pod network runs WireGuard, and the wireguard module cannot load on this node"
		c.Fix = "boot a kernel with the wireguard module (Linux 5.6 or later has it), then restart k3s on the node"
	default:
		c.Status = StatusWarn
		c.Detail = "the wireguard module cannot load: the pod network stays on VXLAN, and kip node add needs WireGuard"
		c.Fix = "boot a kernel with the wireguard module (Linux 5.6 or later has it) before adding nodes"
	}
	return c
}

// checkFirewall reports who manages the node's host firewall, reached at addr. What a server's
// firewall must let in is what kip writes into one it manages (host.ServerRules); a worker's
// rules come with kip node add, which applies them again, as a re-run of install does the
// server's.
func checkFirewall(node, addr string, fw host.FirewallState, server bool, sshPort int) Check {
	c := Check{Name: "firewall", Node: node, Status: StatusOK}
	switch {
	case !fw.Active:
		c.Detail = "no active host firewall: the provider's firewall must keep the node's ports closed"
		if fw.Tool != "" {
			c.Detail = fw.Tool + " is not active: the provider's firewall must keep the node's ports closed"
		}
	case fw.Managed && fw.Unbound:
		c.Status = StatusWarn
		c.Detail = fw.Tool + " is managed by kip with an older kip's rules, which trust the pod and service networks on every interface, " +
			"so a host on a shared network that sends from a pod address reaches every port"
		c.Fix = "run 'kip node add " + addr + "' again, which applies kip's rules now (" + host.Describe(host.PodNetworkRules()) + ")"
		if server {
			c.Fix = "run '" + rerunInstall(addr) + "' again, which applies kip's rules now (" + host.Describe(host.PodNetworkRules()) + ")"
		}
	case fw.Managed:
		c.Detail = fw.Tool + " is active and managed by kip"
	default:
		c.Status = StatusWarn
		c.Detail = fw.Tool + " is active and not managed by kip: kip leaves it alone"
		if fw.Tool == "ufw" {
			c.Detail += ", and kip node add refuses to join a node while such a ufw runs on the server or a worker"
		}
		c.Fix = "allow the cluster's ports in " + fw.Tool + " yourself: 10250/tcp, 51820/udp and 9100/tcp from the other nodes, " +
			host.Describe(host.PodNetworkRules())
		if server {
			c.Fix = "make sure " + fw.Tool + " lets in " + host.Describe(host.ServerRules(cmp.Or(sshPort, 22)))
		}
	}
	return c
}

// checkLonghornOS warns about a Longhorn node whose OS or kernel cannot run Longhorn.
func checkLonghornOS(node string, f *sshx.Facts) Check {
	if err := host.CheckLonghorn(f.OS, f.Kernel); err != nil {
		return Check{Name: "longhorn os", Node: node, Status: StatusWarn, Detail: err.Error(),
			Fix: host.LonghornOSFix}
	}
	name := f.OS.PrettyName
	if name == "" {
		name = strings.TrimSpace(f.OS.ID + " " + f.OS.VersionID)
	}
	return Check{Name: "longhorn os", Node: node, Status: StatusOK, Detail: fmt.Sprintf("%s, kernel %s: Longhorn runs here", name, f.Kernel)}
}

// volumeDir splits a local-path directory name, <pv>_<namespace>_<claim>.
func volumeDir(path string) (pv, namespace, claim string) {
	base := filepath.Base(path)
	pv, rest, ok := strings.Cut(base, "_")
	if !ok {
		return base, "", ""
	}
	namespace, claim, _ = strings.Cut(rest, "_")
	return pv, namespace, claim
}
