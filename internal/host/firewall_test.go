package host

import (
	"net/netip"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Real output, captured on a lab host (Debian 12, ufw 0.36.2, firewalld 1.3.3) after the
// commands kip runs, with an operator's rule (8080, "mine") added.
const (
	ufwAdded = `Added user rules (see 'ufw status' for running firewall):
ufw allow 22/tcp comment 'kip-managed'
ufw allow 80/tcp comment 'kip-managed'
ufw allow in on cni0 from 10.42.0.0/16 comment 'kip-managed'
ufw allow in on flannel-wg from 10.42.0.0/16 comment 'kip-managed'
ufw allow in on flannel.1 from 10.42.0.0/16 comment 'kip-managed'
ufw allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'
ufw allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'
ufw allow 6443/tcp comment 'kip-managed'
ufw allow 8080 comment 'mine'
ufw allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'
`
	ufwVerbose = `Status: active
Logging: on (low)
Default: deny (incoming), allow (outgoing), disabled (routed)
New profiles: skip

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW IN    Anywhere                   # kip-managed
80/tcp                     ALLOW IN    Anywhere                   # kip-managed
Anywhere on cni0           ALLOW IN    10.42.0.0/16               # kip-managed
Anywhere on flannel-wg     ALLOW IN    10.42.0.0/16               # kip-managed
Anywhere on flannel.1      ALLOW IN    10.42.0.0/16               # kip-managed
51820/udp                  ALLOW IN    10.0.0.5                   # kip-managed
10250/tcp                  ALLOW IN    10.0.0.0/24                # kip-managed
6443/tcp                   ALLOW IN    Anywhere                   # kip-managed
8080                       ALLOW IN    Anywhere                   # mine
22/tcp (v6)                ALLOW IN    Anywhere (v6)              # kip-managed
80/tcp (v6)                ALLOW IN    Anywhere (v6)              # kip-managed
6443/tcp (v6)              ALLOW IN    Anywhere (v6)              # kip-managed
8080 (v6)                  ALLOW IN    Anywhere (v6)              # mine
9100/tcp                   ALLOW IN    fd00::/8                   # kip-managed

`
	// ufwAddedOld and ufwVerboseOld are the same but for the pod network's rule, as kip wrote it
	// before it bound the rule to the pod network's interfaces: from 10.42.0.0/16 on any.
	ufwAddedOld = `Added user rules (see 'ufw status' for running firewall):
ufw allow 22/tcp comment 'kip-managed'
ufw allow 80/tcp comment 'kip-managed'
ufw allow from 10.42.0.0/16 comment 'kip-managed'
ufw allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'
ufw allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'
ufw allow 6443/tcp comment 'kip-managed'
ufw allow 8080 comment 'mine'
ufw allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'
`
	ufwVerboseOld = `Status: active
Logging: on (low)
Default: deny (incoming), allow (outgoing), deny (routed)
New profiles: skip

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW IN    Anywhere                   # kip-managed
80/tcp                     ALLOW IN    Anywhere                   # kip-managed
Anywhere                   ALLOW IN    10.42.0.0/16               # kip-managed
51820/udp                  ALLOW IN    10.0.0.5                   # kip-managed
10250/tcp                  ALLOW IN    10.0.0.0/24                # kip-managed
6443/tcp                   ALLOW IN    Anywhere                   # kip-managed
8080                       ALLOW IN    Anywhere                   # mine
22/tcp (v6)                ALLOW IN    Anywhere (v6)              # kip-managed
80/tcp (v6)                ALLOW IN    Anywhere (v6)              # kip-managed
9100/tcp                   ALLOW IN    fd00::/8                   # kip-managed
6443/tcp (v6)              ALLOW IN    Anywhere (v6)              # kip-managed
8080 (v6)                  ALLOW IN    Anywhere (v6)              # mine

`
	ufwUnmanaged = `Status: active

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW       Anywhere                  
22/tcp (v6)                ALLOW       Anywhere (v6)             

`
	ufwNoneAdded = "Added user rules (see 'ufw status' for running firewall):\n(None)\n"
	// firewalldZone is kip's zone as firewalld 1.3.3 rewrote it after
	// firewall-cmd --permanent --zone=kipper --add-port=443/tcp, as kip wrote it before it bound
	// the pod network's rule to the pod network's interfaces (the rule is in the zone that holds
	// every interface).
	firewalldZone = `<?xml version="1.0" encoding="utf-8"?>
<zone>
  <short>kipper</short>
  <description>kip-managed</description>
  <port port="22" protocol="tcp"/>
  <port port="80" protocol="tcp"/>
  <port port="443" protocol="tcp"/>
  <rule family="ipv4">
    <source address="10.42.0.0/16"/>
    <accept/>
  </rule>
  <rule family="ipv4">
    <source address="10.0.0.5/32"/>
    <port port="51820" protocol="udp"/>
    <accept/>
  </rule>
  <forward/>
</zone>
`
	// firewalldPodZone is kip's pod zone as firewalld 1.3.3 rewrote it after
	// firewall-cmd --permanent --zone=kipper-pods --add-port=1/tcp, then --remove-port=1/tcp:
	// the interfaces after the rules.
	firewalldPodZone = `<?xml version="1.0" encoding="utf-8"?>
<zone>
  <short>Kipper pods</short>
  <description>kip-managed</description>
  <rule family="ipv4">
    <source address="10.42.0.0/16"/>
    <accept/>
  </rule>
  <rule family="ipv4">
    <source address="10.43.0.0/16"/>
    <accept/>
  </rule>
  <interface name="cni0"/>
  <interface name="flannel-wg"/>
  <interface name="flannel.1"/>
  <forward/>
</zone>
`
	// firewalldPodPolicy is kip's pod policy as kip writes it.
	firewalldPodPolicy = `<?xml version="1.0" encoding="UTF-8"?>
<policy target="CONTINUE">
  <short>Kipper pods out</short>
  <description>kip-managed</description>
  <ingress-zone name="kipper-pods"></ingress-zone>
  <egress-zone name="ANY"></egress-zone>
  <rule family="ipv4">
    <source address="10.42.0.0/16"></source>
    <accept></accept>
  </rule>
  <rule family="ipv4">
    <source address="10.43.0.0/16"></source>
    <accept></accept>
  </rule>
</policy>
`
)

// capturedRules are the rules kip's marked lines in ufwAdded stand for.
var capturedRules = []Rule{
	{Port: 22, Proto: "tcp"},
	{Port: 80, Proto: "tcp"},
	{Sources: []netip.Prefix{PodNetwork}, Interfaces: PodInterfaces},
	{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}},
	{Port: 10250, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}},
	{Port: 6443, Proto: "tcp"},
	{Port: 9100, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
}

func TestScriptsSyntax(t *testing.T) {
	scripts := map[string]string{"firewall.sh": firewallScript, "firewalld.sh": firewalldScript, "prep.sh": prepScript}
	for name, script := range scripts {
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v: %s", name, err, out)
		}
		if _, err := exec.LookPath("shellcheck"); err == nil {
			if out, err := exec.Command("shellcheck", "-s", "sh", name).CombinedOutput(); err != nil {
				t.Errorf("shellcheck %s: %v: %s", name, err, out)
			}
		}
	}
	// The commands ApplyFirewall runs: the ufw script kip renders, and each family's whole command.
	p := &fwProbe{ufw: ufwState{installed: true, managed: true, kip: []string{"allow 8/tcp" + ufwComment}}}
	for _, managed := range []bool{false, true} {
		p.ufw.managed = managed
		script, _ := ufw{}.apply(p, ServerRules(22))
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("sh -n the ufw script: %v: %s\n%s", err, out, script)
		}
	}
	for _, f := range []Family{Debian, RHEL} {
		cmd := f.applyCommand(p, ServerRules(22))
		if out, err := exec.Command("sh", "-n", "-c", cmd).CombinedOutput(); err != nil {
			t.Errorf("sh -n the %s command: %v: %s\n%s", f.Name, err, out, cmd)
		}
	}
}

// TestFirewallScriptLocally runs firewall.sh on this machine, without SSH, and parses it.
func TestFirewallScriptLocally(t *testing.T) {
	out, err := exec.Command("sh", "-c", firewallScript, "kip-firewall", FirewalldZone, FirewalldPodZone, FirewalldPodPolicy).Output()
	if err != nil {
		t.Fatalf("firewall.sh: %v", err)
	}
	if _, err := parseProbe(string(out)); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
}

func TestParseUFW(t *testing.T) {
	for _, tc := range []struct {
		name, status, added string
		want                ufwState
		err                 bool
	}{
		{name: "not installed"},
		{name: "inactive", status: "Status: inactive\n", added: ufwNoneAdded, want: ufwState{installed: true}},
		{name: "active", status: ufwUnmanaged, want: ufwState{installed: true, active: true}},
		{name: "managed", status: ufwVerbose, added: ufwAdded, want: ufwState{installed: true, active: true, managed: true, incoming: "deny", kip: []string{
			"allow 22/tcp comment 'kip-managed'",
			"allow 80/tcp comment 'kip-managed'",
			"allow in on cni0 from 10.42.0.0/16 comment 'kip-managed'",
			"allow in on flannel-wg from 10.42.0.0/16 comment 'kip-managed'",
			"allow in on flannel.1 from 10.42.0.0/16 comment 'kip-managed'",
			"allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'",
			"allow 6443/tcp comment 'kip-managed'",
			"allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'",
		}, added: []string{
			"allow 22/tcp", "allow 80/tcp", "allow in on cni0 from 10.42.0.0/16", "allow in on flannel-wg from 10.42.0.0/16",
			"allow in on flannel.1 from 10.42.0.0/16", "allow from 10.0.0.5 to any port 51820 proto udp",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp", "allow 6443/tcp", "allow 8080", "allow from fd00::/8 to any port 9100 proto tcp",
		}}},
		{name: "managed by an older kip", status: ufwVerboseOld, added: ufwAddedOld, want: ufwState{installed: true, active: true, managed: true, incoming: "deny", kip: []string{
			"allow 22/tcp comment 'kip-managed'",
			"allow 80/tcp comment 'kip-managed'",
			"allow from 10.42.0.0/16 comment 'kip-managed'",
			"allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'",
			"allow 6443/tcp comment 'kip-managed'",
			"allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'",
		}, added: []string{
			"allow 22/tcp", "allow 80/tcp", "allow from 10.42.0.0/16", "allow from 10.0.0.5 to any port 51820 proto udp",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp", "allow 6443/tcp", "allow 8080", "allow from fd00::/8 to any port 9100 proto tcp",
		}}},
		// ufw status without verbose, as ufw 0.36.2 prints rules bound to an interface: the marker
		// alone makes it kip's (no default policy shown).
		{name: "status with rules on cni0", status: "Status: active\n\nTo                         Action      From\n--                         ------      ----\n" +
			"22/tcp                     ALLOW       Anywhere                   # kip-managed\n" +
			"Anywhere on cni0           ALLOW       10.42.0.0/16               # kip-managed\n" +
			"Anywhere on flannel-wg     ALLOW       10.43.0.0/16               # kip-managed\n" +
			"10250/tcp on cni0          ALLOW       10.0.0.5                   # kip-managed\n",
			want: ufwState{installed: true, active: true, managed: true}},
		{name: "operator's rule on cni0", status: "Status: active\n\nAnywhere on cni0           ALLOW       10.42.0.0/16\n",
			want: ufwState{installed: true, active: true}},
		{name: "managed while inactive", status: "Status: inactive\n", added: ufwNoneAdded[:58] + "ufw allow 22/tcp comment 'kip-managed'\n",
			want: ufwState{installed: true, managed: true, kip: []string{"allow 22/tcp comment 'kip-managed'"}, added: []string{"allow 22/tcp"}}},
		{name: "reject incoming", status: "Status: active\nDefault: reject (incoming), allow (outgoing), disabled (routed)\n", want: ufwState{installed: true, active: true, incoming: "reject"}},
		{name: "other comment", status: "Status: active\n\n6443/tcp ALLOW Anywhere # kip-managed-not\n", want: ufwState{installed: true, active: true}},
		{name: "not root", status: "ERROR: You need to be root to run this script\n", err: true},
		{name: "odd status", status: "Status: sleeping\n", err: true},
		{name: "odd added", added: "ERROR: You need to be root to run this script\n", err: true},
		{name: "odd rule", added: ufwNoneAdded + "allow 22\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUFW(tc.status, tc.added)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseUFW(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"Status: inactive\n", ufwNoneAdded}, {ufwUnmanaged, ""}, {ufwVerbose, ufwAdded}, {ufwVerboseOld, ufwAddedOld}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, status, added string) {
		u, err := parseUFW(status, added)
		if err == nil && u.managed && !strings.Contains(status+added, FirewallMarker) {
			t.Errorf("managed without the marker in %q, %q", status, added)
		}
		if err == nil && (u.active || u.managed) && !u.installed {
			t.Errorf("active or managed but not installed: %+v", u)
		}
	})
}

func TestParseFirewalld(t *testing.T) {
	for _, tc := range []struct {
		state, zone      string
		installed, runs  bool
		managed, invalid bool
	}{
		{state: ""},
		{state: "not running\n", installed: true},
		{state: "running\n", installed: true, runs: true},
		{state: "running\n", zone: firewalldZone, installed: true, runs: true, managed: true},
		{state: "running\n", zone: `<zone><description>my zone</description></zone>`, installed: true, runs: true},
		{state: "running\n", zone: `<zone><description>`, invalid: true},
	} {
		got, err := parseFirewalld(tc.state, tc.zone)
		if (err != nil) != tc.invalid {
			t.Errorf("parseFirewalld(%q, %q): error %v", tc.state, tc.zone, err)
			continue
		}
		if got.installed != tc.installed || got.running != tc.runs || got.managed != tc.managed || (tc.zone != "" && !tc.invalid && got.zone == nil) {
			t.Errorf("parseFirewalld(%q, %q) = %+v", tc.state, tc.zone, got)
		}
	}
}

func FuzzParseFirewalld(f *testing.F) {
	f.Add("running\n", firewalldZone)
	f.Add("running\n", firewalldPodZone)
	f.Add("not running\n", "")
	f.Add("running\n", "<zone><description>kip-managed</description><service name='x'/></zone>")
	f.Fuzz(func(t *testing.T, state, zone string) {
		fd, err := parseFirewalld(state, zone)
		if err != nil {
			return
		}
		if fd.managed && (fd.zone == nil || strings.TrimSpace(fd.zone.Description) != FirewallMarker) {
			t.Errorf("managed without the marker in %q", zone)
		}
		if fd.zone != nil {
			fd.zone.key() // must not panic
		}
	})
}

func TestParseFirewall(t *testing.T) {
	for _, tc := range []struct {
		name                               string
		ufwStatus, ufwAdded, fdState, zone string
		want                               FirewallState
		err                                string
	}{
		{name: "nothing"},
		{name: "ufw inactive", ufwStatus: "Status: inactive\n", ufwAdded: ufwNoneAdded, want: FirewallState{Tool: "ufw"}},
		{name: "ufw managed", ufwStatus: ufwVerbose, ufwAdded: ufwAdded, want: FirewallState{Tool: "ufw", Active: true, Managed: true}},
		{name: "firewalld stopped", fdState: "not running", want: FirewallState{Tool: "firewalld"}},
		{name: "ufw managed by an older kip", ufwStatus: ufwVerboseOld, ufwAdded: ufwAddedOld, want: FirewallState{Tool: "ufw", Active: true, Managed: true, Unbound: true}},
		// firewalldZone is an older kip's: it trusts the pod network on every interface.
		{name: "firewalld managed", fdState: "running", zone: firewalldZone, want: FirewallState{Tool: "firewalld", Active: true, Managed: true, Unbound: true}},
		{name: "firewalld managed, the zone now", fdState: "running", zone: strings.Replace(firewalldZone, "  <rule family=\"ipv4\">\n    <source address=\"10.42.0.0/16\"/>\n    <accept/>\n  </rule>\n", "", 1),
			want: FirewallState{Tool: "firewalld", Active: true, Managed: true}},
		{name: "both inactive", ufwStatus: "Status: inactive\n", fdState: "not running", want: FirewallState{Tool: "ufw"}},
		{name: "firewalld managed and stopped, ufw inactive", ufwStatus: "Status: inactive\n", fdState: "not running", zone: firewalldZone,
			want: FirewallState{Tool: "firewalld", Managed: true, Unbound: true}},
		{name: "firewalld runs, ufw inactive", ufwStatus: "Status: inactive\n", fdState: "running", want: FirewallState{Tool: "firewalld", Active: true}},
		{name: "both active, firewalld the operator's", ufwStatus: ufwVerbose, ufwAdded: ufwAdded, fdState: "running",
			want: FirewallState{Tool: "firewalld", Active: true}},
		{name: "both active and managed", ufwStatus: ufwVerbose, fdState: "running", zone: firewalldZone,
			want: FirewallState{Tool: "ufw", Active: true, Managed: true}},
		{name: "bad ufw", ufwStatus: "ERROR: You need to be root to run this script", err: "ufw: "},
		{name: "bad zone", fdState: "running", zone: "<zone", err: "firewalld: zone kipper: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFirewall(tc.ufwStatus, tc.ufwAdded, tc.fdState, tc.zone)
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error starting %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseProbe(t *testing.T) {
	section := func(name, body string) string { return "\n@@kip-firewall " + name + "\n" + body }
	out := "banner\n" + section("ufw", ufwVerbose) + section("ufw-added", ufwAdded) + section("firewalld", "") +
		section("firewalld-default", "") + section("firewalld-zone", "") + section("firewalld-pod-zone", "") + section("firewalld-pod-policy", "") +
		section("sshd-ports", "22\n2222\n")
	p, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.state(); st != (FirewallState{Tool: "ufw", Active: true, Managed: true}) || !reflect.DeepEqual(p.sshPorts, []int{22, 2222}) {
		t.Errorf("state %+v, ssh ports %v", st, p.sshPorts)
	}
	if p.firewalld.zone != nil || p.firewalld.podZone != nil || p.firewalld.podPolicy != nil {
		t.Errorf("zones read from empty sections: %+v", p.firewalld)
	}

	fd := "\n" + section("ufw", "") + section("ufw-added", "") + section("firewalld", "running\n") + section("firewalld-default", "kipper\n") +
		section("firewalld-zone", firewalldZone) + section("firewalld-pod-zone", firewalldPodZone) + section("firewalld-pod-policy", firewalldPodPolicy) +
		section("sshd-ports", "")
	if p, err = parseProbe(fd); err != nil {
		t.Fatal(err)
	}
	if st := p.state(); st != (FirewallState{Tool: "firewalld", Active: true, Managed: true, Unbound: true}) || p.firewalld.defaultZone != FirewalldZone ||
		p.firewalld.zone == nil || p.firewalld.podZone == nil || len(p.firewalld.podZone.Interfaces) != 3 ||
		p.firewalld.podPolicy == nil || len(p.firewalld.podPolicy.Ingress) != 1 {
		t.Errorf("firewalld: state %+v, %+v", st, p.firewalld)
	}
	for _, bad := range []string{"", strings.Replace(out, "sshd-ports", "other", 1), strings.Replace(out, "22\n2222", "ssh", 1), out + section("ufw", ""),
		strings.Replace(out, "firewalld-pod-zone", "firewalld-pods", 1), strings.Replace(fd, firewalldPodZone, "<zone>", 1),
		strings.Replace(out, "firewalld-pod-policy", "firewalld-policy", 1), strings.Replace(fd, firewalldPodPolicy, "<policy>", 1)} {
		if _, err := parseProbe(bad); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

func TestServerRules(t *testing.T) {
	var got []string
	for _, r := range ServerRules(2222) {
		got = append(got, r.String())
	}
	want := []string{"2222/tcp", "80/tcp", "443/tcp", "6443/tcp",
		"every port from 10.42.0.0/16 on cni0, flannel-wg and flannel.1", "every port from 10.43.0.0/16 on cni0, flannel-wg and flannel.1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if err := validate(ServerRules(22)); err != nil {
		t.Error(err)
	}
	// The rules are the caller's: changing them leaves PodInterfaces and the next call alone.
	ServerRules(22)[4].Interfaces[0] = "eth0"
	if PodInterfaces[0] != "cni0" || ServerRules(22)[4].Interfaces[0] != "cni0" {
		t.Errorf("a caller changed the pod network's interfaces: %q", PodInterfaces)
	}
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Sources: []netip.Prefix{PodNetwork}, Interfaces: []string{"cni0"}}, "every port from 10.42.0.0/16 on cni0"},
		{Rule{Port: 10250, Proto: "tcp", Sources: []netip.Prefix{PodNetwork, ServiceNetwork}, Interfaces: []string{"cni0", "flannel-wg"}},
			"10250/tcp from 10.42.0.0/16 and 10.43.0.0/16 on cni0 and flannel-wg"},
	} {
		if got := tc.rule.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.rule, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	net := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		rule Rule
		err  string
	}{
		{Rule{Port: 22, Proto: "tcp"}, ""},
		{Rule{Port: 51820, Proto: "udp", Sources: net}, ""},
		{Rule{Sources: net}, ""},
		{Rule{Port: 70000, Proto: "tcp"}, "out of range"},
		{Rule{Port: -1, Proto: "tcp"}, "out of range"},
		{Rule{Port: 22}, `protocol "" is not tcp or udp`},
		{Rule{Port: 22, Proto: "sctp"}, "not tcp or udp"},
		{Rule{Proto: "tcp", Sources: net}, "takes no protocol"},
		{Rule{}, "would open the whole host"},
		{Rule{Port: 22, Proto: "tcp", Sources: []netip.Prefix{{}}}, "not an IPv4 or IPv6 network"},
		{Rule{Port: 22, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.1/128")}}, "not an IPv4 or IPv6 network"},
		{Rule{Sources: net, Interfaces: []string{"cni0", "flannel.1", "flannel-wg", "eth_0"}}, ""},
		{Rule{Sources: net, Interfaces: []string{"eth+"}}, `"eth+" is not an interface name`},
		{Rule{Sources: net, Interfaces: []string{"cni0 eth0"}}, "not an interface name"},
		{Rule{Sources: net, Interfaces: []string{"a-name-too-long0"}}, "not an interface name"},
		{Rule{Sources: net, Interfaces: []string{""}}, "not an interface name"},
		{Rule{Port: 22, Proto: "tcp", Interfaces: []string{"cni0"}}, "a rule bound to interfaces needs sources"},
	} {
		err := validate([]Rule{tc.rule})
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("validate(%+v) = %v, want %q", tc.rule, err, tc.err)
		}
	}
	// firewalld puts an interface in one zone: every rule bound to interfaces names the same.
	pods := Rule{Sources: net, Interfaces: []string{"cni0", "flannel-wg"}, Why: "pods"}
	if err := validate([]Rule{pods, {Port: 22, Proto: "tcp"}, pods}); err != nil {
		t.Error(err)
	}
	other := Rule{Sources: net, Interfaces: []string{"cni0"}, Why: "other"}
	if err := validate([]Rule{pods, other}); err == nil || err.Error() != `rule "other": bound to cni0, where another rule is bound to cni0 and flannel-wg: firewalld puts an interface in one zone` {
		t.Errorf("rules bound to different interfaces: %v", err)
	}
}

func TestUFWRules(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want []string
	}{
		{Rule{Port: 22, Proto: "tcp"}, []string{"allow 22/tcp"}},
		{Rule{Port: 51820, Proto: "udp"}, []string{"allow 51820/udp"}},
		{Rule{Sources: []netip.Prefix{PodNetwork, ServiceNetwork}}, []string{"allow from 10.42.0.0/16", "allow from 10.43.0.0/16"}},
		{Rule{Sources: []netip.Prefix{PodNetwork, ServiceNetwork}, Interfaces: PodInterfaces}, []string{
			"allow in on cni0 from 10.42.0.0/16", "allow in on flannel-wg from 10.42.0.0/16", "allow in on flannel.1 from 10.42.0.0/16",
			"allow in on cni0 from 10.43.0.0/16", "allow in on flannel-wg from 10.43.0.0/16", "allow in on flannel.1 from 10.43.0.0/16"}},
		{Rule{Port: 10250, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}, Interfaces: []string{"cni0"}},
			[]string{"allow in on cni0 from 10.0.0.5 to any port 10250 proto tcp"}},
		{Rule{Port: 10250, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/32"), netip.MustParsePrefix("10.0.1.7/24")}},
			[]string{"allow from 10.0.0.2 to any port 10250 proto tcp", "allow from 10.0.1.0/24 to any port 10250 proto tcp"}},
		{Rule{Port: 9100, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/128")}}, []string{"allow from 2001:db8::1 to any port 9100 proto tcp"}},
	} {
		var got []string
		for _, args := range ufwRules([]Rule{tc.rule, tc.rule}) { // duplicates collapse
			got = append(got, strings.Join(args, " "))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.rule, got, tc.want)
		}
	}
	// ufw prints kip's rules back exactly as kip renders them.
	u, err := parseUFW(ufwVerbose, ufwAdded)
	if err != nil {
		t.Fatal(err)
	}
	if !(ufw{}).inPlace(&fwProbe{ufw: u}, capturedRules) {
		t.Errorf("the captured ufw is not in place for the rules it was made with: %q", u.kip)
	}
	if (ufw{}).inPlace(&fwProbe{ufw: u}, unbound(capturedRules)) {
		t.Error("the captured ufw is in place for the rules on any interface")
	}
	old, err := parseUFW(ufwVerboseOld, ufwAddedOld)
	if err != nil {
		t.Fatal(err)
	}
	if !(ufw{}).inPlace(&fwProbe{ufw: old}, unbound(capturedRules)) || (ufw{}).inPlace(&fwProbe{ufw: old}, capturedRules) {
		t.Error("the ufw an older kip wrote is not in place for its own rules only")
	}
}

func TestUFWApply(t *testing.T) {
	managed, err := parseUFW(ufwVerbose, ufwAdded)
	if err != nil {
		t.Fatal(err)
	}
	inactive := managed
	inactive.active, inactive.incoming = false, ""
	olderKip, err := parseUFW(ufwVerboseOld, ufwAddedOld)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ufw   ufwState
		rules []Rule
		want  []string
	}{
		{name: "takeover", ufw: ufwState{}, rules: ServerRules(22), want: []string{
			"ufw --force reset",
			"ufw default deny incoming",
			"ufw default allow outgoing",
			"ufw allow 22/tcp comment kip-managed",
			"ufw allow 80/tcp comment kip-managed",
			"ufw allow 443/tcp comment kip-managed",
			"ufw allow 6443/tcp comment kip-managed",
			"ufw allow in on cni0 from 10.42.0.0/16 comment kip-managed",
			"ufw allow in on flannel-wg from 10.42.0.0/16 comment kip-managed",
			"ufw allow in on flannel.1 from 10.42.0.0/16 comment kip-managed",
			"ufw allow in on cni0 from 10.43.0.0/16 comment kip-managed",
			"ufw allow in on flannel-wg from 10.43.0.0/16 comment kip-managed",
			"ufw allow in on flannel.1 from 10.43.0.0/16 comment kip-managed",
			"ufw --force enable",
		}},
		{name: "in place", ufw: managed, rules: capturedRules},
		{name: "reconcile", ufw: managed, rules: append(capturedRules[1:5:5], Rule{Port: 2222, Proto: "tcp"}), want: []string{
			"ufw allow 2222/tcp comment kip-managed", // added before the old SSH port goes
			"ufw delete allow 22/tcp",
			"ufw delete allow 6443/tcp",
			"ufw delete allow from fd00::/8 to any port 9100 proto tcp",
		}},
		{name: "re-enable", ufw: inactive, rules: capturedRules, want: []string{"ufw default deny incoming", "ufw --force enable"}},
		// An older kip trusted the pod network on every interface: the bound rules come first,
		// then the old one goes; the operator's 8080 stays.
		{name: "rules of an older kip", ufw: olderKip, rules: capturedRules, want: []string{
			"ufw allow in on cni0 from 10.42.0.0/16 comment kip-managed",
			"ufw allow in on flannel-wg from 10.42.0.0/16 comment kip-managed",
			"ufw allow in on flannel.1 from 10.42.0.0/16 comment kip-managed",
			"ufw delete allow from 10.42.0.0/16",
		}},
		{name: "rules of an older kip, in place for them", ufw: olderKip, rules: unbound(capturedRules)},
		// And back, should kip ever unbind them: the same reconcile.
		{name: "bound rules unbound", ufw: managed, rules: unbound(capturedRules), want: []string{
			"ufw allow from 10.42.0.0/16 comment kip-managed",
			"ufw delete allow in on cni0 from 10.42.0.0/16",
			"ufw delete allow in on flannel-wg from 10.42.0.0/16",
			"ufw delete allow in on flannel.1 from 10.42.0.0/16",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script, args := ufw{}.apply(&fwProbe{ufw: tc.ufw}, tc.rules)
			got := strings.Split(script, "\n")
			if got[0] != "set -eu" || args != nil {
				t.Fatalf("script %q, args %q", script, args)
			}
			var cmds []string
			for _, l := range got[2:] {
				cmds = append(cmds, strings.TrimSuffix(l, " >/dev/null"))
			}
			if !reflect.DeepEqual(cmds, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(cmds, "\n"), strings.Join(tc.want, "\n"))
			}
			p := &fwProbe{ufw: tc.ufw}
			if in := (ufw{}).inPlace(p, tc.rules); in != (tc.want == nil) {
				t.Errorf("inPlace = %v with commands %q to run", in, tc.want)
			}
		})
	}
}

func TestRenderZones(t *testing.T) {
	rules := append(ServerRules(22), Rule{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("2001:db8::/64")}})
	wantMain := `<?xml version="1.0" encoding="UTF-8"?>
<zone>
  <short>Kipper</short>
  <description>kip-managed</description>
  <port port="22" protocol="tcp"></port>
  <port port="80" protocol="tcp"></port>
  <port port="443" protocol="tcp"></port>
  <port port="6443" protocol="tcp"></port>
  <rule family="ipv4">
    <source address="10.0.0.5"></source>
    <port port="51820" protocol="udp"></port>
    <accept></accept>
  </rule>
  <rule family="ipv6">
    <source address="2001:db8::/64"></source>
    <port port="51820" protocol="udp"></port>
    <accept></accept>
  </rule>
  <forward></forward>
</zone>
`
	// The pod network's rules hold on its interfaces only, in a zone that holds them.
	wantPods := `<?xml version="1.0" encoding="UTF-8"?>
<zone>
  <short>Kipper pods</short>
  <description>kip-managed</description>
  <interface name="cni0"></interface>
  <interface name="flannel-wg"></interface>
  <interface name="flannel.1"></interface>
  <rule family="ipv4">
    <source address="10.42.0.0/16"></source>
    <accept></accept>
  </rule>
  <rule family="ipv4">
    <source address="10.43.0.0/16"></source>
    <accept></accept>
  </rule>
  <forward></forward>
</zone>
`
	main, pods := renderZones(rules)
	if got := main.file(); got != wantMain {
		t.Errorf("kip's zone: got\n%s\nwant\n%s", got, wantMain)
	}
	if pods == nil {
		t.Fatal("no pod zone")
	}
	if got := pods.file(); got != wantPods {
		t.Errorf("the pod zone: got\n%s\nwant\n%s", got, wantPods)
	}
	for _, z := range []*zone{main, pods} {
		back, err := parseZone(z.file())
		if err != nil || back.key() != z.key() {
			t.Fatalf("the rendered zone does not read back: %v\n%s", err, z.file())
		}
	}
	if _, pods := renderZones(unbound(rules)); pods != nil {
		t.Errorf("a pod zone for rules bound to no interface:\n%s", pods.file())
	}
}

// TestFirewalldInPlace: kip's zones as firewalld lays them out read as the zones kip renders, and
// any change to them, or a zone missing or left over, is not in place.
func TestFirewalldInPlace(t *testing.T) {
	ports := []Rule{{Port: 22, Proto: "tcp"}, {Port: 80, Proto: "tcp"}, {Port: 443, Proto: "tcp"}}
	peer := Rule{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}}
	// What an older kip wrote (firewalldZone): the pod network trusted on every interface.
	older := append(slices.Clone(ports), Rule{Sources: []netip.Prefix{PodNetwork}}, peer)
	// What kip writes now: the same zone without that rule, and the pod zone (firewalldPodZone).
	current := append(append(slices.Clone(ports), PodNetworkRules()...), peer)
	currentZone := strings.Replace(firewalldZone, "  <rule family=\"ipv4\">\n    <source address=\"10.42.0.0/16\"/>\n    <accept/>\n  </rule>\n", "", 1)
	if currentZone == firewalldZone {
		t.Fatal("the pod network's rule is not in the captured zone")
	}
	probe := func(t *testing.T, mainFile, podFile, policyFile string) *fwProbe {
		t.Helper()
		fd, err := parseFirewalld("running", mainFile)
		if err != nil {
			t.Fatal(err)
		}
		if podFile != "" {
			if fd.podZone, err = parseZone(podFile); err != nil {
				t.Fatal(err)
			}
		}
		if policyFile != "" {
			if fd.podPolicy, err = parsePolicy(policyFile); err != nil {
				t.Fatal(err)
			}
		}
		fd.defaultZone = FirewalldZone
		return &fwProbe{firewalld: fd}
	}
	for _, tc := range []struct {
		name                          string
		mainFile, podFile, policyFile string
		rules                         []Rule
		in                            bool
	}{
		{name: "an older kip's zone, its own rules", mainFile: firewalldZone, rules: older, in: true},
		{name: "an older kip's zone, the rules now", mainFile: firewalldZone, rules: current},
		{name: "an older kip's zone with the pod zone", mainFile: firewalldZone, podFile: firewalldPodZone, rules: current},
		{name: "the zones now", mainFile: currentZone, podFile: firewalldPodZone, policyFile: firewalldPodPolicy, rules: current, in: true},
		{name: "the pod policy missing", mainFile: currentZone, podFile: firewalldPodZone, rules: current},
		{name: "the pod policy left over", mainFile: firewalldZone, policyFile: firewalldPodPolicy, rules: older},
		{name: "the pod policy accepts everything", mainFile: currentZone, podFile: firewalldPodZone,
			policyFile: strings.Replace(firewalldPodPolicy, `target="CONTINUE"`, `target="ACCEPT"`, 1), rules: current},
		{name: "the pod policy to the host", mainFile: currentZone, podFile: firewalldPodZone,
			policyFile: strings.Replace(firewalldPodPolicy, `"ANY"`, `"HOST"`, 1), rules: current},
		{name: "the pod policy from the default zone", mainFile: currentZone, podFile: firewalldPodZone,
			policyFile: strings.Replace(firewalldPodPolicy, `name="kipper-pods"`, `name="kipper"`, 1), rules: current},
		{name: "the pod zone missing", mainFile: currentZone, rules: current},
		{name: "the pod zone left over", mainFile: firewalldZone, podFile: firewalldPodZone, rules: older},
		{name: "an interface less", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, `  <interface name="flannel.1"/>`+"\n", "", 1), rules: current},
		{name: "another interface", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, `"flannel.1"`, `"eth0"`, 1), rules: current},
		{name: "the pod zone binds a source", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, "<forward/>", `<forward/><source address="10.42.0.0/16"/>`, 1), rules: current},
		{name: "the pod zone accepts everything", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, "<zone>", `<zone target="ACCEPT">`, 1), rules: current},
		{name: "the pod zone without forward", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, "<forward/>", "", 1), rules: current},
		{name: "the service network's rule missing", mainFile: currentZone, podFile: strings.Replace(firewalldPodZone, "10.43.0.0/16", "10.42.0.0/16", 1), rules: current},
		{name: "the pod network's rule in kip's zone too", mainFile: firewalldZone, podFile: firewalldPodZone, rules: current},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if in := (firewalld{}).inPlace(probe(t, tc.mainFile, tc.podFile, tc.policyFile), tc.rules); in != tc.in {
				t.Errorf("in place: %v, want %v", in, tc.in)
			}
		})
	}

	// Changes to kip's zone.
	p := probe(t, firewalldZone, "", "")
	for name, change := range map[string]func(string) string{
		"a port less": func(s string) string { return strings.Replace(s, `<port port="443" protocol="tcp"/>`, "", 1) },
		"a service": func(s string) string {
			return strings.Replace(s, "<forward/>", `<forward/><service name="cockpit"/>`, 1)
		},
		"a source": func(s string) string {
			return strings.Replace(s, "<forward/>", `<forward/><source address="0.0.0.0/0"/>`, 1)
		},
		"an interface": func(s string) string {
			return strings.Replace(s, "<forward/>", `<forward/><interface name="cni0"/>`, 1)
		},
		"target":       func(s string) string { return strings.Replace(s, "<zone>", `<zone target="ACCEPT">`, 1) },
		"no forward":   func(s string) string { return strings.Replace(s, "<forward/>", "", 1) },
		"rule to port": func(s string) string { return strings.Replace(s, `port="51820"`, `port="51821"`, 1) },
		"a drop rule": func(s string) string {
			return strings.Replace(s, "<accept/>\n  </rule>\n  <rule", "<drop/>\n  </rule>\n  <rule", 1)
		},
	} {
		z, err := parseZone(change(firewalldZone))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p.firewalld.zone = z
		if (firewalld{}).inPlace(p, older) {
			t.Errorf("%s: in place", name)
		}
	}
	p = probe(t, currentZone, firewalldPodZone, firewalldPodPolicy)
	p.firewalld.defaultZone = "public"
	if (firewalld{}).inPlace(p, current) {
		t.Error("in place while kip's zone is not the default zone")
	}
	p.firewalld.defaultZone, p.firewalld.running = FirewalldZone, false
	if (firewalld{}).inPlace(p, current) {
		t.Error("in place while firewalld is stopped")
	}

	// apply writes both zones and the pod policy, or removes the pod zone and the policy when no
	// rule is bound to interfaces.
	main, pods := renderZones(current)
	if script, args := (firewalld{}).apply(p, current); script != firewalldScript ||
		!reflect.DeepEqual(args, []string{"kipper", main.file(), "kipper-pods", pods.file(), "kipper-pods-out", firewalldPodPolicy}) {
		t.Errorf("apply: %q", args)
	}
	main, _ = renderZones(older)
	if _, args := (firewalld{}).apply(p, older); !reflect.DeepEqual(args, []string{"kipper", main.file(), "kipper-pods", "", "kipper-pods-out", ""}) {
		t.Errorf("apply without a pod zone: %q", args)
	}
}

func TestRefuse(t *testing.T) {
	rules := ServerRules(22)
	parse := func(t *testing.T, status, added, fdState, zone string) *fwProbe {
		t.Helper()
		u, err := parseUFW(status, added)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := parseFirewalld(fdState, zone)
		if err != nil {
			t.Fatal(err)
		}
		return &fwProbe{ufw: u, firewalld: fd, sshPorts: []int{22}}
	}
	for _, tc := range []struct {
		name                         string
		family                       Family
		status, added, fdState, zone string
		rules                        []Rule
		err                          []string
	}{
		{name: "fresh", family: Debian},
		{name: "ufw inactive", family: Debian, status: "Status: inactive", added: ufwNoneAdded},
		{name: "ufw managed", family: Debian, status: ufwVerbose, added: ufwAdded},
		{name: "ufw the operator's", family: Debian, status: ufwUnmanaged, added: ufwNoneAdded, err: []string{
			"ufw on h is active and not managed by kip: kip leaves an operator's firewall alone; " +
				"allow 22/tcp, 80/tcp, 443/tcp, 6443/tcp, every port from 10.42.0.0/16 on cni0, flannel-wg and flannel.1, " +
				"every port from 10.43.0.0/16 on cni0, flannel-wg and flannel.1 in it yourself, " +
				"or turn it off (ufw disable) and run the command again to let kip manage ufw"}},
		{name: "firewalld the operator's", family: RHEL, fdState: "running", err: []string{"firewalld on h is active and not managed by kip", "(systemctl disable --now firewalld)"}},
		{name: "firewalld managed", family: RHEL, fdState: "running", zone: firewalldZone},
		{name: "firewalld on debian", family: Debian, fdState: "running", zone: firewalldZone, err: []string{
			"firewalld is active on h, where kip manages ufw: two firewalls would filter the same traffic; turn firewalld off (systemctl disable --now firewalld)"}},
		{name: "ssh elsewhere", family: Debian, rules: ServerRules(2222), err: []string{
			"open none of the ports sshd listens on (22/tcp) to every source: enabling ufw would lock SSH out"}},
		{name: "ssh from some sources only", family: Debian, rules: []Rule{{Port: 22, Proto: "tcp", Sources: []netip.Prefix{PodNetwork}}}, err: []string{"would lock SSH out"}},
		{name: "ssh on some interfaces only", family: Debian, rules: []Rule{{Port: 22, Proto: "tcp", Sources: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Interfaces: []string{"eth0"}}},
			err: []string{"would lock SSH out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rules
			if tc.rules != nil {
				r = tc.rules
			}
			err := tc.family.refuse("h", parse(t, tc.status, tc.added, tc.fdState, tc.zone), r)
			if len(tc.err) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no refusal")
			}
			for _, s := range tc.err {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%v\nlacks %q", err, s)
				}
			}
		})
	}
	p := parse(t, "", "", "", "")
	p.sshPorts = nil
	if err := Debian.refuse("h", p, ServerRules(2222)); err != nil {
		t.Errorf("refused without knowing sshd's ports: %v", err)
	}
}

// TestUfwBlocks: an operator's active ufw is checked against kip's rules; what it does not let in
// comes back as the ufw commands that would.
func TestUfwBlocks(t *testing.T) {
	rules := ServerRules(22)
	const active = "Status: active\nDefault: deny (incoming), allow (outgoing), disabled (routed)\n"
	const header = "Added user rules (see 'ufw status' for running firewall):\n"
	onlySSH := header + "ufw allow 22/tcp\n"
	got, err := UfwBlocks(active, onlySSH, rules)
	want := []string{"ufw allow 80/tcp", "ufw allow 443/tcp", "ufw allow 6443/tcp",
		"ufw allow in on cni0 from 10.42.0.0/16", "ufw allow in on flannel-wg from 10.42.0.0/16", "ufw allow in on flannel.1 from 10.42.0.0/16",
		"ufw allow in on cni0 from 10.43.0.0/16", "ufw allow in on flannel-wg from 10.43.0.0/16", "ufw allow in on flannel.1 from 10.43.0.0/16"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("only SSH: %q %v, want %q", got, err, want)
	}
	for name, status := range map[string]string{
		"inactive":          "Status: inactive\n",
		"allows by default": "Status: active\nDefault: allow (incoming), allow (outgoing), disabled (routed)\n",
		"kip's own":         ufwVerbose,
	} {
		added := onlySSH
		if name == "kip's own" {
			added = ufwAdded
		}
		if got, err := UfwBlocks(status, added, rules); err != nil || got != nil {
			t.Errorf("%s: %q %v, want nothing", name, got, err)
		}
	}
	// An operator's rules that let in as much or more: any protocol, any interface.
	for name, tc := range map[string]struct {
		added string
		want  []string
	}{
		"wider": {added: header + "ufw allow 22\nufw allow 80\nufw allow 443/tcp\nufw allow 6443\nufw allow from 10.42.0.0/16\nufw allow from 10.43.0.0/16\n"},
		"bound": {added: header + "ufw allow 22/tcp\nufw allow 80/tcp\nufw allow 443/tcp\nufw allow 6443/tcp\n" +
			"ufw allow in on cni0 from 10.42.0.0/16\nufw allow in on flannel-wg from 10.42.0.0/16\nufw allow in on flannel.1 from 10.42.0.0/16\n" +
			"ufw allow in on cni0 from 10.43.0.0/16 comment 'pods'\nufw allow in on flannel-wg from 10.43.0.0/16\nufw allow from 10.43.0.0/16\n"},
		"cni0 only": {added: header + "ufw allow 22/tcp\nufw allow 80/tcp\nufw allow 443/tcp\nufw allow 6443/tcp\n" +
			"ufw allow in on cni0 from 10.42.0.0/16\nufw allow in on cni0 from 10.43.0.0/16\n",
			want: []string{"ufw allow in on flannel-wg from 10.42.0.0/16", "ufw allow in on flannel.1 from 10.42.0.0/16",
				"ufw allow in on flannel-wg from 10.43.0.0/16", "ufw allow in on flannel.1 from 10.43.0.0/16"}},
		"another network": {added: header + "ufw allow 22/tcp\nufw allow 80/tcp\nufw allow 443/tcp\nufw allow 6443/tcp\n" +
			"ufw allow from 10.42.0.0/16\nufw allow in on cni0 from 10.0.0.0/8\n",
			want: []string{"ufw allow in on cni0 from 10.43.0.0/16", "ufw allow in on flannel-wg from 10.43.0.0/16", "ufw allow in on flannel.1 from 10.43.0.0/16"}},
	} {
		if got, err := UfwBlocks(active, tc.added, rules); err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %q %v, want %q", name, got, err, tc.want)
		}
	}
}

func TestPeerAndWorkerRules(t *testing.T) {
	server, w2 := netip.MustParseAddr("10.77.0.20"), netip.MustParseAddr("10.77.0.22")
	if got := Describe(PeerRules(nil, server)); got != "" {
		t.Errorf("no other node: %q", got)
	}
	got := Describe(append(WorkerRules(22), PeerRules([]netip.Addr{server, w2}, server)...))
	want := "22/tcp, every port from 10.42.0.0/16 on cni0, flannel-wg and flannel.1, every port from 10.43.0.0/16 on cni0, flannel-wg and flannel.1, " +
		"51820/udp from 10.77.0.20/32 and 10.77.0.22/32, " +
		"10250/tcp from 10.77.0.20/32 and 10.77.0.22/32, 9100/tcp from 10.77.0.20/32"
	if got != want {
		t.Errorf("a worker's rules:\n%s\nwant:\n%s", got, want)
	}
	if err := validate(append(WorkerRules(22), PeerRules([]netip.Addr{server}, server)...)); err != nil {
		t.Error(err)
	}
	if got := Describe(PeerRules([]netip.Addr{w2}, netip.Addr{})); got != "51820/udp from 10.77.0.22/32, 10250/tcp from 10.77.0.22/32" {
		t.Errorf("the server's peer rules: %q", got)
	}
}
