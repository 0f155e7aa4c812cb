package host

import (
	"net/netip"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// Real output, captured on a lab host (Debian 12, ufw 0.36.2, firewalld 1.3.3) after the
// commands kip runs, with an operator's rule (8080, "mine") added.
const (
	ufwAdded = `Added user rules (see 'ufw status' for running firewall):
ufw allow 22/tcp comment 'kip-managed'
ufw allow 80/tcp comment 'kip-managed'
ufw allow from 10.42.0.0/16 comment 'kip-managed'
ufw allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'
ufw allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'
ufw allow 6443/tcp comment 'kip-managed'
ufw allow 8080 comment 'mine'
ufw allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'
`
	ufwVerbose = `Status: active
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
	// firewall-cmd --permanent --zone=kipper --add-port=443/tcp.
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
)

// capturedRules are the rules kip's marked lines in ufwAdded stand for.
var capturedRules = []Rule{
	{Port: 22, Proto: "tcp"},
	{Port: 80, Proto: "tcp"},
	{Sources: []netip.Prefix{PodNetwork}},
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
	out, err := exec.Command("sh", "-c", firewallScript, "kip-firewall", FirewalldZone).Output()
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
			"allow from 10.42.0.0/16 comment 'kip-managed'",
			"allow from 10.0.0.5 to any port 51820 proto udp comment 'kip-managed'",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp comment 'kip-managed'",
			"allow 6443/tcp comment 'kip-managed'",
			"allow from fd00::/8 to any port 9100 proto tcp comment 'kip-managed'",
		}, added: []string{
			"allow 22/tcp", "allow 80/tcp", "allow from 10.42.0.0/16", "allow from 10.0.0.5 to any port 51820 proto udp",
			"allow from 10.0.0.0/24 to any port 10250 proto tcp", "allow 6443/tcp", "allow 8080", "allow from fd00::/8 to any port 9100 proto tcp",
		}}},
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
	for _, s := range [][2]string{{"", ""}, {"Status: inactive\n", ufwNoneAdded}, {ufwUnmanaged, ""}, {ufwVerbose, ufwAdded}} {
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
		{name: "firewalld managed", fdState: "running", zone: firewalldZone, want: FirewallState{Tool: "firewalld", Active: true, Managed: true}},
		{name: "both inactive", ufwStatus: "Status: inactive\n", fdState: "not running", want: FirewallState{Tool: "ufw"}},
		{name: "firewalld managed and stopped, ufw inactive", ufwStatus: "Status: inactive\n", fdState: "not running", zone: firewalldZone,
			want: FirewallState{Tool: "firewalld", Managed: true}},
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
		section("firewalld-default", "") + section("firewalld-zone", "") + section("sshd-ports", "22\n2222\n")
	p, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if st := p.state(); st != (FirewallState{Tool: "ufw", Active: true, Managed: true}) || !reflect.DeepEqual(p.sshPorts, []int{22, 2222}) {
		t.Errorf("state %+v, ssh ports %v", st, p.sshPorts)
	}
	for _, bad := range []string{"", strings.Replace(out, "sshd-ports", "other", 1), strings.Replace(out, "22\n2222", "ssh", 1), out + section("ufw", "")} {
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
	want := []string{"2222/tcp", "80/tcp", "443/tcp", "6443/tcp", "every port from 10.42.0.0/16", "every port from 10.43.0.0/16"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if err := validate(ServerRules(22)); err != nil {
		t.Error(err)
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
	} {
		err := validate([]Rule{tc.rule})
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("validate(%+v) = %v, want %q", tc.rule, err, tc.err)
		}
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
}

func TestUFWApply(t *testing.T) {
	managed, err := parseUFW(ufwVerbose, ufwAdded)
	if err != nil {
		t.Fatal(err)
	}
	inactive := managed
	inactive.active, inactive.incoming = false, ""
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
			"ufw allow from 10.42.0.0/16 comment kip-managed",
			"ufw allow from 10.43.0.0/16 comment kip-managed",
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

func TestRenderZone(t *testing.T) {
	rules := append(ServerRules(22), Rule{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("2001:db8::/64")}})
	want := `<?xml version="1.0" encoding="UTF-8"?>
<zone>
  <short>Kipper</short>
  <description>kip-managed</description>
  <port port="22" protocol="tcp"></port>
  <port port="80" protocol="tcp"></port>
  <port port="443" protocol="tcp"></port>
  <port port="6443" protocol="tcp"></port>
  <rule family="ipv4">
    <source address="10.42.0.0/16"></source>
    <accept></accept>
  </rule>
  <rule family="ipv4">
    <source address="10.43.0.0/16"></source>
    <accept></accept>
  </rule>
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
	if got := renderZone(rules).file(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	z, err := parseZone(renderZone(rules).file())
	if err != nil || z.key() != renderZone(rules).key() {
		t.Fatalf("the rendered zone does not read back: %v", err)
	}

	// firewalld's own layout of the same zone reads as the same zone.
	captured := []Rule{
		{Port: 22, Proto: "tcp"}, {Port: 80, Proto: "tcp"}, {Port: 443, Proto: "tcp"},
		{Sources: []netip.Prefix{PodNetwork}},
		{Port: 51820, Proto: "udp", Sources: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}},
	}
	fd, err := parseFirewalld("running", firewalldZone)
	if err != nil {
		t.Fatal(err)
	}
	p := &fwProbe{firewalld: fd}
	p.firewalld.defaultZone = FirewalldZone
	if !(firewalld{}).inPlace(p, captured) {
		t.Errorf("firewalld's file is not in place:\n%s\nvs\n%s", fd.zone.key(), renderZone(captured).key())
	}
	for name, change := range map[string]func(string) string{
		"a port less": func(s string) string { return strings.Replace(s, `<port port="443" protocol="tcp"/>`, "", 1) },
		"a service": func(s string) string {
			return strings.Replace(s, "<forward/>", `<forward/><service name="cockpit"/>`, 1)
		},
		"a source": func(s string) string {
			return strings.Replace(s, "<forward/>", `<forward/><source address="0.0.0.0/0"/>`, 1)
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
		if (firewalld{}).inPlace(p, captured) {
			t.Errorf("%s: in place", name)
		}
	}
	p.firewalld.zone, p.firewalld.defaultZone = fd.zone, "public"
	if (firewalld{}).inPlace(p, captured) {
		t.Error("in place while kip's zone is not the default zone")
	}
	if script, args := (firewalld{}).apply(p, captured); script != firewalldScript || !reflect.DeepEqual(args, []string{"kipper", renderZone(captured).file()}) {
		t.Errorf("apply: %q", args)
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
				"allow 22/tcp, 80/tcp, 443/tcp, 6443/tcp, every port from 10.42.0.0/16, every port from 10.43.0.0/16 in it yourself, " +
				"or turn it off (ufw disable) and run the command again to let kip manage ufw"}},
		{name: "firewalld the operator's", family: RHEL, fdState: "running", err: []string{"firewalld on h is active and not managed by kip", "(systemctl disable --now firewalld)"}},
		{name: "firewalld managed", family: RHEL, fdState: "running", zone: firewalldZone},
		{name: "firewalld on debian", family: Debian, fdState: "running", zone: firewalldZone, err: []string{
			"firewalld is active on h, where kip manages ufw: two firewalls would filter the same traffic; turn firewalld off (systemctl disable --now firewalld)"}},
		{name: "ssh elsewhere", family: Debian, rules: ServerRules(2222), err: []string{
			"open none of the ports sshd listens on (22/tcp) to every source: enabling ufw would lock SSH out"}},
		{name: "ssh from some sources only", family: Debian, rules: []Rule{{Port: 22, Proto: "tcp", Sources: []netip.Prefix{PodNetwork}}}, err: []string{"would lock SSH out"}},
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
	onlySSH := "Added user rules (see 'ufw status' for running firewall):\nufw allow 22/tcp\n"
	got, err := UfwBlocks("Status: active\nDefault: deny (incoming), allow (outgoing), disabled (routed)\n", onlySSH, rules)
	want := []string{"ufw allow 80/tcp", "ufw allow 443/tcp", "ufw allow 6443/tcp", "ufw allow from 10.42.0.0/16", "ufw allow from 10.43.0.0/16"}
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
}

func TestPeerAndWorkerRules(t *testing.T) {
	server, w2 := netip.MustParseAddr("10.77.0.20"), netip.MustParseAddr("10.77.0.22")
	if got := Describe(PeerRules(nil, server)); got != "" {
		t.Errorf("no other node: %q", got)
	}
	got := Describe(append(WorkerRules(22), PeerRules([]netip.Addr{server, w2}, server)...))
	want := "22/tcp, every port from 10.42.0.0/16, every port from 10.43.0.0/16, 51820/udp from 10.77.0.20/32 and 10.77.0.22/32, " +
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
