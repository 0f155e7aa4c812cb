package host

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/lab"
)

// TestHostPrepLab prepares two real Debian hosts as kip install does, each step checked before
// and after: on lab1 Longhorn's packages, kernel modules (through the lab's modprobe shim),
// sysctls, service hardening and a kip-managed ufw, which ApplyFirewall installs; on lab2 a
// kip-managed firewalld (Debian packages firewalld 1.3, as RHEL 9 does), driven as the RHEL
// family drives it. Both firewalls are checked from outside: 80/tcp answers, 8888/tcp does not;
// and from the pod network (checkPodInterfaces): a connection from a pod address on the shared
// private network is refused, one over cni0 accepted.
func TestHostPrepLab(t *testing.T) {
	mods := Modules(true, true)
	l := lab.ForTest(t, 2, lab.Options{Hosts: []lab.HostOptions{{Modules: mods}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	lab1, lab2 := l.Hosts[0], l.Hosts[1]

	// One host after the other, never side by side: each is the other's peer in the pod-network
	// checks, and a firewall being changed on the peer (ufw's reload flushes its chains, firewalld's
	// start replaces the ruleset) drops the replies to the peer's own connection, which then fails
	// for a reason that has nothing to do with the host under test.
	t.Run("lab1", func(t *testing.T) {
		c := dialLab(ctx, t, lab1)
		t.Run("packages", func(t *testing.T) { testPackages(ctx, t, c, lab1) })
		t.Run("modules", func(t *testing.T) { testModules(ctx, t, c, lab1, mods) })
		t.Run("sysctls", func(t *testing.T) { testSysctls(ctx, t, c, lab1) })
		t.Run("hardening", func(t *testing.T) { testHardening(ctx, t, c, lab1) })
		t.Run("ufw", func(t *testing.T) { testUFW(ctx, t, c, lab1, lab2) })
		if out, err := lab1.Run(ctx, "systemctl is-system-running"); err != nil {
			t.Errorf("lab1 is %s after its preparation: %v", strings.TrimSpace(out), err)
		}
	})
	t.Run("lab2", func(t *testing.T) {
		t.Run("firewalld", func(t *testing.T) { testFirewalld(ctx, t, dialLab(ctx, t, lab2), lab2, lab1) })
	})
}

func dialLab(ctx context.Context, t *testing.T, h *lab.Host) *sshx.Client {
	t.Helper()
	c, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func run(ctx context.Context, t *testing.T, h *lab.Host, cmd string) string {
	t.Helper()
	out, err := h.Run(ctx, cmd)
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
	return out
}

// timed runs f and logs how long it took.
func timed(t *testing.T, what string, f func() error) error {
	t.Helper()
	start := time.Now()
	err := f()
	t.Logf("measured: %s in %s", what, time.Since(start).Round(time.Millisecond))
	return err
}

func testPackages(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host) {
	pkgs := Debian.LonghornPackages
	missing, err := Debian.MissingPackages(ctx, c, pkgs)
	if err != nil || !slices.Equal(missing, pkgs) {
		t.Fatalf("missing before: %q, %v", missing, err)
	}
	if err := timed(t, "InstallPackages "+strings.Join(pkgs, " "), func() error { return Debian.InstallPackages(ctx, c, pkgs) }); err != nil {
		t.Fatal(err)
	}
	if missing, err := Debian.MissingPackages(ctx, c, pkgs); err != nil || len(missing) != 0 {
		t.Fatalf("missing after: %q, %v", missing, err)
	}
	if err := Debian.InstallPackages(ctx, c, []string{"no-such-package-kip"}); err == nil ||
		!strings.Contains(err.Error(), "install no-such-package-kip: ") || !strings.Contains(err.Error(), "Unable to locate package") {
		t.Errorf("installing a package that does not exist: %v", err)
	}
	// A package whose service cannot start in a container would leave the host degraded.
	if out, err := h.Run(ctx, "systemctl is-system-running"); err != nil {
		t.Errorf("lab1 is %s after the install: %v", strings.TrimSpace(out), err)
	}
}

func testModules(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host, mods []string) {
	facts, err := c.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"wireguard", "iscsi_tcp", "nfs"} {
		if facts.Modules[m] != sshx.ModuleLoadable {
			t.Errorf("facts: %s is %s, want loadable through the lab's shim", m, facts.Modules[m])
		}
	}
	if ok, err := ModulesInPlace(ctx, c, mods); err != nil || ok {
		t.Fatalf("in place before: %v, %v", ok, err)
	}
	if err := timed(t, "LoadModules", func() error { return LoadModules(ctx, c, facts.OS, mods) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := ModulesInPlace(ctx, c, mods); err != nil || !ok {
		t.Fatalf("in place after: %v, %v", ok, err)
	}
	if got := run(ctx, t, h, "grep -v '^#' "+modulesFile); got != strings.Join(mods, "\n")+"\n" {
		t.Errorf("%s lists %q", modulesFile, got)
	}
	// A module the host cannot load: named with modprobe's words and the fix; the file stays.
	err = LoadModules(ctx, c, facts.OS, append(slices.Clone(mods), "dm_crypt"))
	t.Logf("error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "1 cannot load: dm_crypt (modprobe: FATAL: Module dm_crypt not found") ||
		!strings.Contains(err.Error(), "fix: boot a kernel that has the dm_crypt module") {
		t.Errorf("loading dm_crypt: %v", err)
	}
	if ok, err := ModulesInPlace(ctx, c, mods); err != nil || !ok {
		t.Errorf("a failed load changed the file: %v, %v", ok, err)
	}
}

func testSysctls(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host) {
	if ok, err := SysctlsInPlace(ctx, c); err != nil || ok {
		t.Fatalf("in place before: %v, %v", ok, err)
	}
	if err := timed(t, "ApplySysctls", func() error { return ApplySysctls(ctx, c) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := SysctlsInPlace(ctx, c); err != nil || !ok {
		t.Fatalf("in place after: %v, %v", ok, err)
	}
	got := run(ctx, t, h, "sysctl -n net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables fs.inotify.max_user_instances")
	// fs.inotify is this machine's kernel's, read-only in a container: kip leaves it.
	t.Logf("ip_forward, bridge-nf-call-iptables, max_user_instances: %q", got)
	if !strings.HasPrefix(got, "1\n1\n") {
		t.Errorf("sysctls: %q", got)
	}
}

func testHardening(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host) {
	if ok, err := HardeningInPlace(ctx, c, true); err != nil || ok {
		t.Fatalf("in place before: %v, %v", ok, err)
	}
	if err := timed(t, "ApplyHardening", func() error { return ApplyHardening(ctx, c, true) }); err != nil {
		t.Fatal(err)
	}
	for _, longhorn := range []bool{true, false} {
		if ok, err := HardeningInPlace(ctx, c, longhorn); err != nil || !ok {
			t.Fatalf("in place after (longhorn %v): %v, %v", longhorn, ok, err)
		}
	}
	// journald runs, restarted, with the cap among its settings.
	out := run(ctx, t, h, "systemctl is-active systemd-journald && systemd-analyze cat-config systemd/journald.conf | grep -x SystemMaxUse=1G && "+
		"journalctl -u systemd-journald -b --no-pager -o cat | tail -n 2")
	t.Logf("journald:\n%s", out)
}

// listen makes the host answer on ports 80 and 8888 (systemd alone: each connection gets "kip").
func listen(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host) {
	t.Helper()
	if err := c.Upload(ctx, "/etc/systemd/system/kip-listen.socket", []byte("[Socket]\nListenStream=80\nListenStream=8888\nAccept=yes\n"), 0o644, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Upload(ctx, "/etc/systemd/system/kip-listen@.service", []byte("[Service]\nExecStart=/bin/echo kip\nStandardOutput=socket\n"), 0o644, ""); err != nil {
		t.Fatal(err)
	}
	run(ctx, t, h, "systemctl daemon-reload && systemctl start kip-listen.socket")
}

// connects reports whether this machine reaches port on addr.
func connects(addr netip.Addr, port uint16) bool {
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, port).String(), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// checkEnforced checks, from outside, that the firewall lets in 80/tcp and not 8888/tcp, and
// that SSH works on the connection kip used and on a new one.
func checkEnforced(ctx context.Context, t *testing.T, c *sshx.Client, h *lab.Host, open80 bool) {
	t.Helper()
	if connects(h.PublicIP, 80) != open80 {
		t.Errorf("80/tcp reachable: %v, want %v", !open80, open80)
	}
	if connects(h.PublicIP, 8888) {
		t.Error("8888/tcp reachable through the firewall")
	}
	if res, err := c.Run(ctx, "true"); err != nil || res.Err() != nil {
		t.Errorf("kip's SSH connection: %v %v", err, res.Err())
	}
	c2, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	if err != nil {
		t.Fatalf("a new SSH connection: %v", err)
	}
	c2.Close()
}

func testUFW(ctx context.Context, t *testing.T, c *sshx.Client, lab1, lab2 *lab.Host) {
	listen(ctx, t, c, lab1)
	if !connects(lab1.PublicIP, 8888) {
		t.Fatal("8888/tcp unreachable before any firewall")
	}
	if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{}) {
		t.Fatalf("before: %+v, %v", st, err)
	}
	rules := ServerRules(22)
	if ok, err := Debian.FirewallInPlace(ctx, c, rules); err != nil || ok {
		t.Fatalf("in place before: %v, %v", ok, err)
	}
	// ufw is missing: ApplyFirewall installs it.
	if err := timed(t, "ApplyFirewall (install ufw)", func() error { return Debian.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{Tool: "ufw", Active: true, Managed: true}) {
		t.Fatalf("after: %+v, %v", st, err)
	}
	if ok, err := Debian.FirewallInPlace(ctx, c, rules); err != nil || !ok {
		t.Fatalf("in place after: %v, %v", ok, err)
	}
	status := run(ctx, t, lab1, "ufw status")
	t.Logf("ufw status:\n%s", status)
	want := []string{`22/tcp +ALLOW +Anywhere +# kip-managed`, `80/tcp +ALLOW +Anywhere +# kip-managed`, `443/tcp +ALLOW +Anywhere +# kip-managed`,
		`6443/tcp +ALLOW +Anywhere +# kip-managed`, `22/tcp \(v6\) +ALLOW +Anywhere \(v6\) +# kip-managed`}
	for _, network := range []string{`10\.42\.0\.0/16`, `10\.43\.0\.0/16`} {
		for _, iface := range []string{`cni0`, `flannel-wg`, `flannel\.1`} {
			want = append(want, `Anywhere on `+iface+` +ALLOW +`+network+` +# kip-managed`)
		}
	}
	for _, want := range want {
		if !regexp.MustCompile(`(?m)^` + want + `$`).MatchString(status) {
			t.Errorf("ufw status lacks %s", want)
		}
	}
	if regexp.MustCompile(`(?m)^Anywhere +ALLOW`).MatchString(status) {
		t.Error("ufw trusts a network on every interface")
	}
	checkEnforced(ctx, t, c, lab1, true)

	before := run(ctx, t, lab1, "ufw status verbose; ufw show added")
	if err := timed(t, "ApplyFirewall (ufw in place)", func() error { return Debian.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	if after := run(ctx, t, lab1, "ufw status verbose; ufw show added"); after != before {
		t.Errorf("re-applying changed ufw:\n%s\nto\n%s", before, after)
	}
	t.Run("pod network", func(t *testing.T) {
		checkPodInterfaces(ctx, t, Debian, c, lab1, lab2, rules, func(t *testing.T, older bool) {
			added := run(ctx, t, lab1, "ufw show added")
			t.Logf("ufw show added:\n%s", added)
			for _, network := range []string{"10.42.0.0/16", "10.43.0.0/16"} {
				unbound := "ufw allow from " + network + " comment 'kip-managed'\n"
				if strings.Contains(added, unbound) != older {
					t.Errorf("ufw show added has %q: %v, want %v", unbound, !older, older)
				}
				for _, iface := range PodInterfaces {
					bound := "ufw allow in on " + iface + " from " + network + " comment 'kip-managed'\n"
					if strings.Contains(added, bound) == older {
						t.Errorf("ufw show added has %q: %v, want %v", bound, older, !older)
					}
				}
			}
		})
	})

	// Other rules: 80/tcp goes, WireGuard from lab2 comes; an operator's rule stays.
	run(ctx, t, lab1, "ufw allow 8080/tcp")
	peer := Rule{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.PrefixFrom(lab2.PrivateIP, 32)}, Why: "WireGuard from lab2"}
	rules2 := append(slices.Clone(rules[:1]), append(slices.Clone(rules[2:]), peer)...)
	if err := timed(t, "ApplyFirewall (ufw, changed rules)", func() error { return Debian.ApplyFirewall(ctx, c, rules2) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := Debian.FirewallInPlace(ctx, c, rules2); err != nil || !ok {
		t.Errorf("in place with the new rules: %v, %v", ok, err)
	}
	added := run(ctx, t, lab1, "ufw show added")
	if !strings.Contains(added, "ufw allow from "+lab2.PrivateIP.String()+" to any port 51820 proto udp comment 'kip-managed'") ||
		strings.Contains(added, "ufw allow 80/tcp") || !strings.Contains(added, "ufw allow 8080/tcp\n") {
		t.Errorf("ufw show added:\n%s", added)
	}
	checkEnforced(ctx, t, c, lab1, false)

	// An operator's ufw: kip refuses and names the fix.
	run(ctx, t, lab1, "ufw --force reset >/dev/null && ufw allow 22/tcp >/dev/null && ufw --force enable")
	if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{Tool: "ufw", Active: true}) {
		t.Fatalf("operator's ufw: %+v, %v", st, err)
	}
	err := Debian.ApplyFirewall(ctx, c, rules)
	t.Logf("refusal: %v", err)
	if err == nil || !strings.Contains(err.Error(), "ufw on "+lab1.PublicIP.String()+" is active and not managed by kip") ||
		!strings.Contains(err.Error(), "turn it off (ufw disable)") {
		t.Errorf("ApplyFirewall on an operator's ufw: %v", err)
	}
	if ok, err := Debian.FirewallInPlace(ctx, c, rules); err != nil || ok {
		t.Errorf("in place on an operator's ufw: %v, %v", ok, err)
	}
}

func testFirewalld(ctx context.Context, t *testing.T, c *sshx.Client, h, peer *lab.Host) {
	f := Debian
	f.Firewall, f.firewall = "firewalld", firewalld{}
	listen(ctx, t, c, h)
	if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{}) {
		t.Fatalf("before: %+v, %v", st, err)
	}
	rules := ServerRules(22)
	// firewalld is missing: ApplyFirewall installs it (Debian starts it with its public zone).
	if err := timed(t, "ApplyFirewall (install firewalld)", func() error { return f.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	inPlace := func(want bool) {
		t.Helper()
		if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{Tool: "firewalld", Active: want, Managed: true}) {
			t.Fatalf("firewall: %+v, %v", st, err)
		}
		if ok, err := f.FirewallInPlace(ctx, c, rules); err != nil || ok != want {
			t.Fatalf("in place: %v, %v; want %v", ok, err, want)
		}
	}
	inPlace(true)
	zones := func(t *testing.T, older bool) {
		t.Helper()
		info := run(ctx, t, h, "firewall-cmd --check-config && firewall-cmd --get-default-zone && firewall-cmd --info-zone=kipper && "+
			"firewall-cmd --get-active-zones && { firewall-cmd --info-zone=kipper-pods || true; }")
		t.Logf("firewalld:\n%s", info)
		kipper, pods, _ := strings.Cut(info, "kipper-pods (active)\n")
		for _, want := range []string{"success\nkipper\n", "ports: 22/tcp 80/tcp 443/tcp 6443/tcp\n", "forward: yes\n"} {
			if !strings.Contains(kipper, want) {
				t.Errorf("kip's zone lacks %q", want)
			}
		}
		for _, network := range []string{"10.42.0.0/16", "10.43.0.0/16"} {
			rule := `rule family="ipv4" source address="` + network + `" accept`
			if strings.Contains(kipper, rule) != older {
				t.Errorf("kip's zone has %q: %v, want %v", rule, !older, older)
			}
			if strings.Contains(pods, rule) == older {
				t.Errorf("the pod zone has %q: %v, want %v", rule, older, !older)
			}
		}
		// The pod zone, active for its interfaces (--get-active-zones), forwarding between them;
		// no zone holds a source.
		if active := "kipper-pods\n  interfaces: cni0 flannel-wg flannel.1\n"; strings.Contains(kipper, active) == older {
			t.Errorf("the active zones have %q: %v, want %v", active, older, !older)
		}
		for _, want := range []string{"  interfaces: cni0 flannel-wg flannel.1\n  sources: \n", "forward: yes\n"} {
			if strings.Contains(pods, want) == older {
				t.Errorf("the pod zone has %q: %v, want %v", want, older, !older)
			}
		}
		if regexp.MustCompile(`(?m)^  sources: \S`).MatchString(info) {
			t.Error("a zone holds a source")
		}
	}
	zones(t, false)
	checkEnforced(ctx, t, c, h, true)

	// In place: nothing is written, nothing reloaded.
	stat := "stat -c '%i %Y' /etc/firewalld/zones/kipper.xml"
	before := run(ctx, t, h, stat)
	if err := timed(t, "ApplyFirewall (firewalld in place)", func() error { return f.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	if after := run(ctx, t, h, stat); after != before {
		t.Errorf("re-applying rewrote the zone: %s then %s", before, after)
	}
	t.Run("pod network", func(t *testing.T) {
		checkPodInterfaces(ctx, t, f, c, h, peer, rules, zones)
		checkPodEgress(ctx, t, f, c, h, rules)
	})

	// A stopped firewalld that kip manages starts again with kip's zone.
	run(ctx, t, h, "systemctl stop firewalld")
	inPlace(false)
	if err := timed(t, "ApplyFirewall (firewalld stopped)", func() error { return f.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	inPlace(true)
	checkEnforced(ctx, t, c, h, true)

	// An operator's firewalld: kip refuses and names the fix.
	run(ctx, t, h, "firewall-cmd --set-default-zone=public >/dev/null && rm /etc/firewalld/policies/kipper-pods-out.xml /etc/firewalld/zones/kipper.xml /etc/firewalld/zones/kipper-pods.xml && "+
		"firewall-cmd --reload >/dev/null")
	if st, err := ReadFirewall(ctx, c); err != nil || st != (FirewallState{Tool: "firewalld", Active: true}) {
		t.Fatalf("operator's firewalld: %+v, %v", st, err)
	}
	err := f.ApplyFirewall(ctx, c, rules)
	t.Logf("refusal: %v", err)
	if err == nil || !strings.Contains(err.Error(), "firewalld on "+h.PublicIP.String()+" is active and not managed by kip") ||
		!strings.Contains(err.Error(), "(systemctl disable --now firewalld)") {
		t.Errorf("ApplyFirewall on an operator's firewalld: %v", err)
	}
}

// checkPodEgress proves on a real connection that a pod's new connection out of the host gets
// through kip's firewalld: the pod (checkPodInterfaces' network namespace behind cni0) connects
// to the lab's apt proxy on the build machine, through h, which forwards and masquerades the pod
// network's traffic as flannel's rules do (added here, in iptables, as flannel adds them, again
// after each firewalld reload, as k3s does when kip restarts it). With
// an older kip's zones (no pod zone, no policy) firewalld refuses it, as it forwards between a
// zone's own interfaces only; kip's pod policy lets it out.
func checkPodEgress(ctx context.Context, t *testing.T, f Family, c *sshx.Client, h *lab.Host, rules []Rule) {
	pod := netip.AddrFrom4([4]byte{10, 42, h.PrivateIP.As4()[3], 5})
	flannel := []string{
		"FORWARD -s 10.42.0.0/16 -j ACCEPT", "FORWARD -d 10.42.0.0/16 -j ACCEPT",
		"POSTROUTING -t nat -s 10.42.0.0/16 ! -d 10.42.0.0/16 -j MASQUERADE",
	}
	// A firewalld reload drops other rules (kip restarts k3s after one, which adds them again):
	// they are added after each apply.
	addFlannel := func() {
		t.Helper()
		for _, r := range flannel {
			run(ctx, t, h, "iptables -w -C "+r+" 2>/dev/null || iptables -w -I "+r)
		}
	}
	run(ctx, t, h, "sysctl -qw net.ipv4.ip_forward=1")
	t.Cleanup(func() {
		for _, r := range flannel {
			h.Run(context.Background(), "iptables -w -D "+r)
		}
	})
	out := func() bool {
		t.Helper()
		cmd := sshx.Command("ip", "netns", "exec", "kip-pod", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--connect-timeout", "3",
			"--max-time", "6", "--interface", pod.String(), lab.AptProxy+"/")
		got, err := h.Run(ctx, cmd+" 2>&1")
		t.Logf("pod %s to %s: %q, %v", pod, lab.AptProxy, got, err)
		return err == nil && regexp.MustCompile(`^[1-5][0-9][0-9]$`).MatchString(strings.TrimSpace(got))
	}
	if err := timed(t, "ApplyFirewall (an older kip's rules)", func() error { return f.ApplyFirewall(ctx, c, unbound(rules)) }); err != nil {
		t.Fatal(err)
	}
	addFlannel()
	if out() {
		t.Fatal("with an older kip's zones, the pod's connection out of the host gets through: the check proves nothing")
	}
	if err := timed(t, "ApplyFirewall (kip's rules)", func() error { return f.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	addFlannel()
	if !out() {
		t.Error("with kip's pod zone and policy, the pod's connection out of the host does not get through")
	}
	if policy := run(ctx, t, h, "firewall-cmd --info-policy="+FirewalldPodPolicy); !strings.Contains(policy, "ingress-zones: "+FirewalldPodZone) ||
		!strings.Contains(policy, "egress-zones: ANY") {
		t.Errorf("firewalld's view of kip's pod policy:\n%s", policy)
	}
}

// checkPodInterfaces proves on real connections that kip's rules trust the pod network on its
// interfaces only. h runs kip's firewall (f's) and answers on 8888/tcp (listen); peer, on the
// private network h shares, sends from an address in the pod network (a secondary address, and a
// route back on h), as a host on a shared network can. h gets a veth pair whose host end is
// cni0, with the other end in a network namespace standing for a pod.
//
// First the rules an older kip wrote (the pod network trusted on every interface): the spoofed
// connection gets in, which shows the lab delivers it and answers it. Then kip's rules: applying
// them replaces the old ones (rules says which are on the host, for older true and false), the
// spoofed connection is refused, the pod's over cni0 accepted, and one over cni0 from outside
// the pod network refused.
func checkPodInterfaces(ctx context.Context, t *testing.T, f Family, c *sshx.Client, h, peer *lab.Host, rules []Rule, checkRules func(t *testing.T, older bool)) {
	n := h.PrivateIP.As4()[3] // this host's own addresses: another host's test runs the same checks
	spoofed := netip.AddrFrom4([4]byte{10, 42, 250, n})
	pod := netip.AddrFrom4([4]byte{10, 42, n, 5})
	outsider := netip.AddrFrom4([4]byte{10, 44, n, 5})
	gateway := netip.AddrFrom4([4]byte{10, 42, n, 1})
	const ns = "kip-pod"
	run(ctx, t, peer, fmt.Sprintf("ip addr add %s/32 dev eth0", spoofed))
	t.Cleanup(func() { peer.Run(context.Background(), fmt.Sprintf("ip addr del %s/32 dev eth0", spoofed)) })
	run(ctx, t, h, strings.Join([]string{
		fmt.Sprintf("ip route add %s/32 via %s dev eth0", spoofed, peer.PrivateIP),
		"ip netns add " + ns,
		"ip link add cni0 type veth peer name pod0 netns " + ns,
		fmt.Sprintf("ip addr add %s/24 dev cni0", gateway),
		"ip link set cni0 up",
		fmt.Sprintf("ip route add %s/32 dev cni0", outsider),
		fmt.Sprintf("ip -n %s addr add %s/24 dev pod0", ns, pod),
		fmt.Sprintf("ip -n %s addr add %s/32 dev pod0", ns, outsider),
		fmt.Sprintf("ip -n %s link set pod0 up", ns),
		fmt.Sprintf("ip -n %s route add default via %s", ns, gateway),
	}, " && "))
	t.Cleanup(func() {
		h.Run(context.Background(), fmt.Sprintf("ip link del cni0; ip netns del %s; ip route del %s/32", ns, spoofed))
	})
	target := netip.AddrPortFrom(h.PrivateIP, 8888)
	// reaches reports whether a connection to target from src (in the network namespace ns when
	// set) gets the listener's answer.
	reaches := func(from *lab.Host, ns string, src netip.Addr) bool {
		t.Helper()
		cmd := sshx.Command("curl", "-sS", "--connect-timeout", "3", "--max-time", "6", "--interface", src.String(), "telnet://"+target.String())
		if ns != "" {
			cmd = sshx.Command("ip", "netns", "exec", ns) + " " + cmd
		}
		out, err := from.Run(ctx, cmd+" </dev/null 2>&1")
		t.Logf("%s from %s on %s: %q, %v", target, src, from.Name, out, err)
		return err == nil && strings.TrimSpace(out) == "kip"
	}

	older := unbound(rules)
	if err := timed(t, "ApplyFirewall (an older kip's rules)", func() error { return f.ApplyFirewall(ctx, c, older) }); err != nil {
		t.Fatal(err)
	}
	checkRules(t, true)
	if !reaches(peer, "", spoofed) {
		t.Fatalf("with the pod network trusted on every interface, %s does not reach %s from %s: the lab does not carry the spoofed connection", peer.Name, target, spoofed)
	}
	if !reaches(h, ns, pod) {
		t.Fatalf("with the pod network trusted on every interface, the pod does not reach %s over cni0", target)
	}

	if ok, err := f.FirewallInPlace(ctx, c, rules); err != nil || ok {
		t.Fatalf("kip's rules in place over an older kip's: %v, %v", ok, err)
	}
	if err := timed(t, "ApplyFirewall (kip's rules over an older kip's)", func() error { return f.ApplyFirewall(ctx, c, rules) }); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.FirewallInPlace(ctx, c, rules); err != nil || !ok {
		t.Fatalf("kip's rules not in place after the apply: %v, %v", ok, err)
	}
	checkRules(t, false)
	if reaches(peer, "", spoofed) {
		t.Errorf("%s reaches %s from the pod address %s on the shared network", peer.Name, target, spoofed)
	}
	if !reaches(h, ns, pod) {
		t.Errorf("the pod at %s does not reach %s over cni0", pod, target)
	}
	if reaches(h, ns, outsider) {
		t.Errorf("%s, outside the pod network, reaches %s over cni0", outsider, target)
	}
	if reaches(peer, "", peer.PrivateIP) {
		t.Errorf("%s reaches %s from its own address", peer.Name, target)
	}
}
