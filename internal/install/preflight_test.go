package install

import (
	"net/netip"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/sshx"
)

// Real output, captured: labProbe from a lab host (Debian 12, root, nothing installed), ufw's from
// the same host with ufw enabled, localProbe from the build machine.
const (
	labProbe = `
@@kip-preflight ports
tcp LISTEN 0      128    0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=42,fd=3))
tcp LISTEN 0      128       [::]:22    [::]:* users:(("sshd",pid=42,fd=4))

@@kip-preflight k3s-pids

@@kip-preflight processes

@@kip-preflight paths

@@kip-preflight cni

@@kip-preflight ufw

@@kip-preflight ufw-added

@@kip-preflight firewalld

@@kip-preflight firewalld-zone

@@kip-preflight k3s-version

@@kip-preflight server-data

@@kip-preflight k3s-unit

@@kip-preflight intent
`
	localPorts = `tcp LISTEN 0      250    198.51.100.1:3142 0.0.0.0:* users:(("apt-cacher-ng",pid=24553,fd=12))
tcp LISTEN 0      128         0.0.0.0:2024 0.0.0.0:*                                          
`
	ufwUnmanaged = `Status: active

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW       Anywhere                  
22/tcp (v6)                ALLOW       Anywhere (v6)             

`
	ufwManaged = `Status: active

To                         Action      From
--                         ------      ----
22/tcp                     ALLOW       Anywhere                  
6443/tcp                   ALLOW       Anywhere                   # kip-managed
22/tcp (v6)                ALLOW       Anywhere (v6)             
6443/tcp (v6)              ALLOW       Anywhere (v6)              # kip-managed

`
	// kipZone is the file of kip's firewalld zone, reduced to its marker.
	kipZone = `<?xml version="1.0" encoding="utf-8"?>
<zone><description>kip-managed</description></zone>
`
)

func TestPreflightScriptSyntax(t *testing.T) {
	if out, err := exec.Command("sh", "-n", "preflight.sh").CombinedOutput(); err != nil {
		t.Errorf("sh -n preflight.sh: %v: %s", err, out)
	}
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", "-s", "sh", "preflight.sh").CombinedOutput(); err != nil {
			t.Errorf("shellcheck preflight.sh: %v: %s", err, out)
		}
	}
}

// TestPreflightScriptLocally runs the script on this machine, without SSH, and parses it.
func TestPreflightScriptLocally(t *testing.T) {
	out, err := exec.Command("sh", "-c", preflightScript, "kip-preflight", host.FirewalldZone).Output()
	if err != nil {
		t.Fatalf("preflight.sh: %v", err)
	}
	if _, err := parseProbe(string(out)); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
}

// labPorts is the ports section of labProbe.
const labPorts = `tcp LISTEN 0      128    0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=42,fd=3))
tcp LISTEN 0      128       [::]:22    [::]:* users:(("sshd",pid=42,fd=4))
`

// probeWith returns the lab host's probe with the sections given replaced.
func probeWith(sections map[string]string) string {
	var b strings.Builder
	for _, name := range probeSections {
		body, ok := sections[name]
		if !ok && name == "ports" {
			body = labPorts
		}
		b.WriteString("\n@@kip-preflight " + name + "\n" + body)
	}
	return b.String()
}

func TestParseProbe(t *testing.T) {
	if probeWith(nil) != labProbe {
		t.Fatal("probeWith(nil) is not the lab host's probe")
	}
	for _, tc := range []struct {
		name, out string
		want      *probe
		err       string
	}{
		{name: "lab host", out: labProbe, want: &probe{
			has:       map[string]bool{"ports": true, "k3s-pids": false, "processes": false, "paths": false, "cni": false, "ufw": false, "ufw-added": false, "firewalld": false, "firewalld-zone": false, "k3s-version": false, "server-data": false, "k3s-unit": false, "intent": false},
			listeners: []listener{{"tcp", "0.0.0.0", 22, "sshd", 42}, {"tcp", "[::]", 22, "sshd", 42}},
		}},
		{name: "everything", out: probeWith(map[string]string{
			"processes": "containerd\nk3s-server", "paths": "/etc/rancher/k3s\n/usr/local/bin/k3s\n/var/lib/kubelet",
			"cni": "10-flannel.conflist", "ufw": ufwManaged, "firewalld": "not running", "firewalld-zone": kipZone,
		}), want: &probe{
			has:       map[string]bool{"ports": true, "k3s-pids": false, "processes": true, "paths": true, "cni": true, "ufw": true, "ufw-added": false, "firewalld": true, "firewalld-zone": true, "k3s-version": false, "server-data": false, "k3s-unit": false, "intent": false},
			listeners: []listener{{"tcp", "0.0.0.0", 22, "sshd", 42}, {"tcp", "[::]", 22, "sshd", 42}},
			processes: []string{"containerd", "k3s-server"},
			paths:     []string{"/etc/rancher/k3s", "/usr/local/bin/k3s", "/var/lib/kubelet"},
			cni:       []string{"10-flannel.conflist"},
			firewall:  host.FirewallState{Tool: "ufw", Active: true, Managed: true},
			ufwStatus: ufwManaged,
			state:     hostState{firewall: host.FirewallState{Tool: "ufw", Active: true, Managed: true}},
		}},
		{name: "banner before", out: "Welcome!\n" + labProbe, want: &probe{
			has:       map[string]bool{"ports": true, "k3s-pids": false, "processes": false, "paths": false, "cni": false, "ufw": false, "ufw-added": false, "firewalld": false, "firewalld-zone": false, "k3s-version": false, "server-data": false, "k3s-unit": false, "intent": false},
			listeners: []listener{{"tcp", "0.0.0.0", 22, "sshd", 42}, {"tcp", "[::]", 22, "sshd", 42}},
		}},
		{name: "empty", out: "", err: "no sections"},
		{name: "missing section", out: strings.Replace(labProbe, "\n@@kip-preflight cni\n", "\n", 1), err: `section "cni" is missing`},
		{name: "twice", out: labProbe + "\n@@kip-preflight cni\n", err: `section "cni" appears twice`},
		{name: "unknown section", out: labProbe + "\n@@kip-preflight other\n", err: `unexpected section "other"`},
		{name: "bad ports", out: probeWith(map[string]string{"ports": "nonsense"}), err: "ports:"},
		{name: "bad ufw", out: probeWith(map[string]string{"ufw": "ERROR: You need to be root to run this script"}), err: "firewall: ufw:"},
		{name: "bad zone", out: probeWith(map[string]string{"firewalld-zone": "<zone>"}), err: "firewall: firewalld:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProbe(tc.out)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseProbe(f *testing.F) {
	f.Add(labProbe)
	f.Add(probeWith(map[string]string{"ports": localPorts, "ufw": ufwManaged, "processes": "kubelet"}))
	f.Add("")
	f.Fuzz(func(t *testing.T, out string) {
		p, err := parseProbe(out)
		if err != nil {
			return
		}
		// Whatever parses must evaluate without panicking.
		evaluate("h", goodFacts(), p, Request{Storage: cluster.StorageLonghorn})
	})
}

func TestParseListeners(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []listener
		err      bool
	}{
		{name: "empty", in: ""},
		{name: "build machine", in: localPorts, want: []listener{{"tcp", "198.51.100.1", 3142, "apt-cacher-ng", 24553}, {"tcp", "0.0.0.0", 2024, "", 0}}},
		{name: "udp and scoped", in: `udp UNCONN 0 0 127.0.0.53%lo:53 0.0.0.0:* users:(("systemd-resolve",pid=300,fd=13))
udp UNCONN 0 0 0.0.0.0:8472 0.0.0.0:*
tcp LISTEN 0 4096 *:6443 *:* users:(("systemd",pid=1,fd=40),("k3s",pid=9,fd=3))`,
			want: []listener{{"udp", "127.0.0.53%lo", 53, "systemd-resolve", 300}, {"udp", "0.0.0.0", 8472, "", 0}, {"tcp", "*", 6443, "systemd", 1}}},
		{name: "quoted name", in: `tcp LISTEN 0 1 0.0.0.0:1 0.0.0.0:* users:(("a \"b\" c",pid=1,fd=1))`, want: []listener{{"tcp", "0.0.0.0", 1, `a \"b\" c`, 1}}},
		{name: "short", in: "tcp LISTEN 0 128", err: true},
		{name: "protocol", in: "raw UNCONN 0 0 0.0.0.0:1 0.0.0.0:*", err: true},
		{name: "no port", in: "tcp LISTEN 0 128 0.0.0.0 0.0.0.0:*", err: true},
		{name: "port too big", in: "tcp LISTEN 0 128 0.0.0.0:70000 0.0.0.0:*", err: true},
		{name: "port star", in: "tcp LISTEN 0 128 0.0.0.0:* 0.0.0.0:*", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseListeners(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error %v", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseListeners(f *testing.F) {
	f.Add(localPorts)
	f.Add("tcp LISTEN 0      128    0.0.0.0:22 0.0.0.0:* users:((\"sshd\",pid=42,fd=3))\n")
	f.Add("udp UNCONN 0 0 [::1%lo]:53 [::]:*\n")
	f.Fuzz(func(t *testing.T, in string) {
		ls, err := parseListeners(in)
		if err != nil {
			return
		}
		for _, l := range ls {
			if l.Proto != "tcp" && l.Proto != "udp" {
				t.Errorf("protocol %q", l.Proto)
			}
		}
	})
}

const gibi = 1 << 30

// goodFacts is a 4 GB Debian 12 server that passes every check for nano.
func goodFacts() *sshx.Facts {
	return &sshx.Facts{
		OS:          sshx.OS{ID: "debian", VersionID: "12", PrettyName: "Debian GNU/Linux 12 (bookworm)"},
		Kernel:      "6.1.0-28-amd64",
		CPUs:        1,
		MemTotalMiB: 3900,
		Disks: map[string]sshx.Disk{
			cluster.RancherDir:  {Mount: "/", TotalBytes: 40 * gibi, FreeBytes: 30 * gibi},
			cluster.LonghornDir: {Mount: "/", TotalBytes: 40 * gibi, FreeBytes: 30 * gibi},
		},
		Addrs: []sshx.Addr{{Iface: "lo", CIDR: netip.MustParsePrefix("127.0.0.1/8")}, {Iface: "eth0", CIDR: netip.MustParsePrefix("203.0.113.10/24")}},
		Routes: []sshx.Route{
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("203.0.113.1"), Dev: "eth0"},
			{Dst: netip.MustParsePrefix("203.0.113.0/24"), Dev: "eth0", Src: netip.MustParseAddr("203.0.113.10")},
		},
		Init:    "systemd",
		Modules: map[string]sshx.ModuleState{"wireguard": sshx.ModuleLoadable, "iscsi_tcp": sshx.ModuleLoadable, "nfs": sshx.ModuleLoaded},
	}
}

// bigFacts is an 8 GB, 2-CPU server with a disk Longhorn accepts.
func bigFacts(f *sshx.Facts) {
	f.MemTotalMiB, f.CPUs = 7900, 2
	f.Disks[cluster.LonghornDir] = sshx.Disk{Mount: "/", TotalBytes: 100 * gibi, FreeBytes: 60 * gibi}
}

func TestPreflightChecks(t *testing.T) {
	disk := func(path string, total, free uint64) func(*sshx.Facts) {
		return func(f *sshx.Facts) { f.Disks[path] = sshx.Disk{Mount: "/", TotalBytes: total, FreeBytes: free} }
	}
	longhornDisk := func(total, free uint64) func(*sshx.Facts) {
		return func(f *sshx.Facts) { bigFacts(f); disk(cluster.LonghornDir, total, free)(f) }
	}
	rocky := func(version, kernel string) func(*sshx.Facts) {
		return func(f *sshx.Facts) {
			bigFacts(f)
			f.OS = sshx.OS{ID: "rocky", IDLike: []string{"rhel", "centos", "fedora"}, VersionID: version}
			f.Kernel = kernel
		}
	}
	module := func(name string, s sshx.ModuleState) func(*sshx.Facts) {
		return func(f *sshx.Facts) { f.Modules[name] = s }
	}
	longhorn := Request{Storage: cluster.StorageLonghorn}
	recorded := func(profile, storage string) Request {
		p, err := cluster.ProfileNamed(profile)
		if err != nil {
			t.Fatal(err)
		}
		return Request{Recorded: &cluster.Sizing{Profile: p, Storage: storage, ProfileReason: "recorded on the cluster", StorageReason: "recorded"}}
	}
	for _, tc := range []struct {
		name  string
		facts func(*sshx.Facts)
		probe map[string]string // sections replaced in the lab host's probe
		want  Request
		check string
		st    Status // "" when the check must not run
		has   string // in the check's detail and fix
	}{
		{name: "debian 12", check: "os", st: StatusOK, has: "Debian GNU/Linux 12"},
		{name: "debian 11", facts: func(f *sshx.Facts) { f.OS.VersionID = "11" }, check: "os", st: StatusFail, has: "Debian 11 is not supported"},
		{name: "fedora", facts: func(f *sshx.Facts) { f.OS = sshx.OS{ID: "fedora", VersionID: "41", PrettyName: "Fedora Linux 41"} }, check: "os", st: StatusFail, has: "Fedora Linux 41 is not supported"},

		{name: "ipv4", check: "ipv4", st: StatusOK, has: "203.0.113.10 on eth0, default route via 203.0.113.1"},
		{name: "no default route", facts: func(f *sshx.Facts) { f.Routes = f.Routes[1:] }, check: "ipv4", st: StatusFail, has: "no IPv4 default route"},
		{name: "no address", facts: func(f *sshx.Facts) { f.Addrs, f.Routes = nil, nil }, check: "ipv4", st: StatusFail, has: "no IPv4 address"},
		{name: "default route without address", facts: func(f *sshx.Facts) { f.Routes[0].Dev = "wg0" }, check: "ipv4", st: StatusFail, has: "goes through wg0, which has no IPv4 address"},
		{name: "unreachable default", facts: func(f *sshx.Facts) { f.Routes[0].Type = "unreachable" }, check: "ipv4", st: StatusFail, has: "no IPv4 default route"},

		{name: "0 CPUs", facts: func(f *sshx.Facts) { f.CPUs = 0 }, check: "cpu", st: StatusFail, has: "at least 1 CPU"},
		{name: "1 CPU", check: "cpu", st: StatusOK, has: "1 CPU"},
		{name: "3499 MiB", facts: func(f *sshx.Facts) { f.MemTotalMiB = 3499 }, check: "memory", st: StatusFail, has: "3499 MiB of RAM; the nano profile needs at least 3500 MiB"},
		{name: "3500 MiB", facts: func(f *sshx.Facts) { f.MemTotalMiB = 3500 }, check: "memory", st: StatusOK, has: "3500 MiB"},
		{name: "20 GiB less a byte", facts: disk(cluster.RancherDir, 100*gibi, 20*gibi-1), check: "disk", st: StatusFail, has: "19.9 GiB free on / (holding /var/lib/rancher); kip needs at least 20.0 GiB"},
		{name: "20 GiB", facts: disk(cluster.RancherDir, 100*gibi, 20*gibi), check: "disk", st: StatusOK, has: "20.0 GiB free"},
		{name: "no df", facts: func(f *sshx.Facts) { delete(f.Disks, cluster.RancherDir) }, check: "disk", st: StatusFail, has: "cannot see"},

		{name: "nano by default", check: "profile", st: StatusOK, has: "nano"},
		{name: "small by default", facts: bigFacts, check: "profile", st: StatusOK, has: "small"},
		{name: "unknown profile", want: Request{Profile: "huge"}, check: "profile", st: StatusFail, has: `unknown profile "huge"`},
		{name: "longhorn on 4 GB", want: longhorn, check: "profile", st: StatusFail, has: "needs at least 6000 MiB of RAM"},

		{name: "no longhorn disk check on local", check: "longhorn disk"},
		{name: "longhorn 25% exactly", facts: longhornDisk(100*gibi, 25*gibi), want: longhorn, check: "longhorn disk", st: StatusFail, has: "keeps more than 25% (25.0 GiB) free, leaving 0.0 GiB"},
		{name: "longhorn under 10 GiB above the reserve", facts: longhornDisk(100*gibi, 35*gibi-1), want: longhorn, check: "longhorn disk", st: StatusFail, has: "leaving 9.9 GiB for volumes; kip needs at least 10.0 GiB above that reserve"},
		{name: "longhorn 10 GiB above the reserve", facts: longhornDisk(100*gibi, 35*gibi), want: longhorn, check: "longhorn disk", st: StatusOK, has: "leaving 10.0 GiB"},
		{name: "longhorn default on small", facts: longhornDisk(100*gibi, 20*gibi), check: "longhorn disk", st: StatusFail, has: "larger disk"},

		{name: "rocky 9.6 longhorn", facts: rocky("9.6", "5.14.0-570.el9.x86_64"), want: longhorn, check: "longhorn os", st: StatusOK},
		{name: "rocky 9.7 longhorn", facts: rocky("9.7", "5.14.0-611.5.1.el9_7.x86_64"), want: longhorn, check: "longhorn os", st: StatusFail, has: "Rocky Linux 9.7 cannot run Longhorn"},
		{name: "rocky 9.7 local", facts: rocky("9.7", "5.14.0-611.5.1.el9_7.x86_64"), want: Request{Storage: cluster.StorageLocal}, check: "longhorn os"},
		// A re-run checks what the recorded profile and storage need: a local nano cluster on a
		// server resized to 8 GiB is not checked against Longhorn's rules (before, preflight picked
		// the small profile on Longhorn for it, as for a new install, and refused Rocky 9.7).
		{name: "re-run of local nano on 8 GiB rocky 9.7", facts: rocky("9.7", "5.14.0-611.5.1.el9_7.x86_64"), want: recorded("nano", cluster.StorageLocal), check: "longhorn os"},
		{name: "re-run of local nano names the record", facts: rocky("9.7", "5.14.0-611.5.1.el9_7.x86_64"), want: recorded("nano", cluster.StorageLocal), check: "profile", st: StatusOK, has: "nano (recorded on the cluster); storage local"},
		{name: "re-run of longhorn on rocky 9.7 warns", facts: rocky("9.7", "5.14.0-611.5.1.el9_7.x86_64"), want: recorded("small", cluster.StorageLonghorn), check: "longhorn os", st: StatusWarn, has: "Rocky Linux 9.7 cannot run Longhorn"},

		{name: "wireguard loaded", facts: module("wireguard", sshx.ModuleLoaded), check: "wireguard", st: StatusOK, has: "pod network: WireGuard"},
		{name: "wireguard loadable", check: "wireguard", st: StatusOK, has: "pod network: WireGuard"},
		{name: "wireguard unavailable", facts: module("wireguard", sshx.ModuleUnavailable), check: "wireguard", st: StatusWarn,
			has: "the wireguard module cannot load: the pod network falls back to VXLAN, and kip node add will need wireguard"},
		{name: "wireguard unknown", facts: func(f *sshx.Facts) { delete(f.Modules, "wireguard") }, check: "wireguard", st: StatusWarn},

		{name: "storage modules", facts: bigFacts, want: longhorn, check: "storage modules", st: StatusOK},
		{name: "iscsi missing", facts: func(f *sshx.Facts) { bigFacts(f); f.Modules["iscsi_tcp"] = sshx.ModuleUnavailable }, want: longhorn,
			check: "storage modules", st: StatusFail, has: "the iscsi_tcp kernel module(s)"},
		{name: "iscsi missing on rocky", facts: func(f *sshx.Facts) {
			rocky("9.6", "5.14.0-570.el9.x86_64")(f)
			f.Modules["iscsi_tcp"] = sshx.ModuleUnavailable
		}, want: longhorn,
			check: "storage modules", st: StatusFail, has: "dnf install kernel-modules-5.14.0-570.el9.x86_64"},
		{name: "no storage modules check on local", facts: module("iscsi_tcp", sshx.ModuleUnavailable), check: "storage modules"},

		{name: "ports free", check: "ports", st: StatusOK, has: "free: 6443/tcp, 10250/tcp, 2379-2380/tcp, 51820/udp"},
		{name: "ports free, vxlan", facts: module("wireguard", sshx.ModuleUnavailable), check: "ports", st: StatusOK, has: "8472/udp"},
		{name: "6443 taken", probe: map[string]string{"ports": `tcp LISTEN 0 4096 *:6443 *:* users:(("kube-apiserver",pid=7,fd=3))`},
			check: "ports", st: StatusFail, has: "6443/tcp (the Kubernetes API) is in use by kube-apiserver"},
		{name: "etcd taken", probe: map[string]string{"ports": `tcp LISTEN 0 4096 127.0.0.1:2380 0.0.0.0:*`},
			check: "ports", st: StatusFail, has: "2380/tcp (etcd) is in use by an unknown process"},
		{name: "8472 with wireguard", probe: map[string]string{"ports": `udp UNCONN 0 0 0.0.0.0:8472 0.0.0.0:*`}, check: "ports", st: StatusOK},
		{name: "8472 with vxlan", facts: module("wireguard", sshx.ModuleUnavailable), probe: map[string]string{"ports": `udp UNCONN 0 0 0.0.0.0:8472 0.0.0.0:*`},
			check: "ports", st: StatusFail, has: "8472/udp (the VXLAN pod network)"},
		{name: "6443 held by the existing k3s", probe: map[string]string{"ports": `tcp LISTEN 0 4096 *:6443 *:* users:(("k3s-server",pid=7,fd=3))`, "paths": "/usr/local/bin/k3s"},
			check: "ports", st: StatusOK},
		{name: "etcd held by a child of the k3s unit", probe: map[string]string{"ports": `tcp LISTEN 0 4096 127.0.0.1:2379 0.0.0.0:* users:(("etcd",pid=701,fd=7))`, "k3s-pids": "700\n701", "paths": "/usr/local/bin/k3s"},
			check: "ports", st: StatusOK},
		{name: "etcd outside the k3s unit", probe: map[string]string{"ports": `tcp LISTEN 0 4096 127.0.0.1:2379 0.0.0.0:* users:(("etcd",pid=702,fd=7))`, "k3s-pids": "700\n701", "paths": "/usr/local/bin/k3s"},
			check: "ports", st: StatusFail, has: "2379/tcp (etcd) is in use by etcd"},
		{name: "6443 held by k3s with no k3s found", probe: map[string]string{"ports": `tcp LISTEN 0 4096 *:6443 *:* users:(("containerd",pid=7,fd=3))`},
			check: "ports", st: StatusFail, has: "in use by containerd"},
		{name: "no ss", probe: map[string]string{"ports": "\n"}, check: "ports", st: StatusWarn, has: "ss is missing"},

		{name: "clean host", check: "kubernetes", st: StatusOK, has: "no other Kubernetes or CNI"},
		{name: "existing k3s", probe: map[string]string{"paths": "/etc/rancher/k3s\n/usr/local/bin/k3s\n/var/lib/kubelet", "processes": "containerd\nk3s-server"},
			check: "kubernetes", st: StatusOK, has: "existing k3s (/etc/rancher/k3s, /usr/local/bin/k3s, process k3s-server): install takes the re-run path"},
		{name: "kubeadm", probe: map[string]string{"paths": "/etc/kubernetes\n/var/lib/kubelet", "processes": "kubelet"},
			check: "kubernetes", st: StatusFail, has: "process kubelet, /etc/kubernetes, /var/lib/kubelet"},
		{name: "docker", probe: map[string]string{"processes": "containerd\ndockerd"}, check: "kubernetes", st: StatusFail, has: "process containerd, process dockerd"},
		{name: "cni", probe: map[string]string{"cni": "10-flannel.conflist"}, check: "kubernetes", st: StatusFail, has: "/etc/cni/net.d/10-flannel.conflist"},
		{name: "k3s and a cni", probe: map[string]string{"cni": "10-calico.conflist", "paths": "/usr/local/bin/k3s"}, check: "kubernetes", st: StatusFail, has: "10-calico.conflist"},

		{name: "no firewall", check: "firewall", st: StatusOK, has: "no active host firewall; kip will manage ufw"},
		{name: "ufw inactive", probe: map[string]string{"ufw": "Status: inactive"}, check: "firewall", st: StatusOK},
		// An operator's ufw that lets in only SSH is refused before anything changes, naming the
		// commands that let in what kip needs; before, install warned, changed the host and waited
		// five minutes for an API the firewall kept out, then blamed k3s.
		{name: "ufw unmanaged, only ssh", probe: map[string]string{"ufw": ufwUnmanaged, "ufw-added": "Added user rules (see 'ufw status' for running firewall):\nufw allow 22/tcp\n"},
			check: "firewall", st: StatusFail,
			has: "on the server run: ufw allow 80/tcp && ufw allow 443/tcp && ufw allow 6443/tcp && " +
				"ufw allow in on cni0 from 10.42.0.0/16 && ufw allow in on flannel-wg from 10.42.0.0/16 && ufw allow in on flannel.1 from 10.42.0.0/16 && " +
				"ufw allow in on cni0 from 10.43.0.0/16 && ufw allow in on flannel-wg from 10.43.0.0/16 && ufw allow in on flannel.1 from 10.43.0.0/16; or turn ufw off (ufw disable)"},
		{name: "ufw unmanaged, all allowed", probe: map[string]string{"ufw": ufwUnmanaged, "ufw-added": "Added user rules (see 'ufw status' for running firewall):\n" +
			"ufw allow 22\nufw allow 80/tcp comment 'web'\nufw allow 443/tcp\nufw allow 6443/tcp\nufw allow from 10.42.0.0/16\nufw allow from 10.43.0.0/16\n"},
			check: "firewall", st: StatusOK, has: "lets in what the cluster needs"},
		{name: "ufw unmanaged, all allowed on the pod network's interfaces", probe: map[string]string{"ufw": ufwUnmanaged, "ufw-added": "Added user rules (see 'ufw status' for running firewall):\n" +
			"ufw allow 22/tcp\nufw allow 80/tcp\nufw allow 443/tcp\nufw allow 6443/tcp\n" +
			"ufw allow in on cni0 from 10.42.0.0/16\nufw allow in on flannel-wg from 10.42.0.0/16\nufw allow in on flannel.1 from 10.42.0.0/16\n" +
			"ufw allow in on cni0 from 10.43.0.0/16\nufw allow in on flannel-wg from 10.43.0.0/16\nufw allow in on flannel.1 from 10.43.0.0/16\n"},
			check: "firewall", st: StatusOK, has: "lets in what the cluster needs"},
		{name: "ufw unmanaged, allows by default", probe: map[string]string{"ufw": "Status: active\nDefault: allow (incoming), allow (outgoing), disabled (routed)\n"},
			check: "firewall", st: StatusOK, has: "lets in what the cluster needs"},
		{name: "ufw managed", probe: map[string]string{"ufw": ufwManaged}, check: "firewall", st: StatusOK, has: "managed by kip"},
		{name: "firewalld unmanaged", facts: rocky("9.6", "5.14.0-570.el9.x86_64"), probe: map[string]string{"firewalld": "running"},
			check: "firewall", st: StatusWarn, has: "firewalld is active and not managed by kip"},
		{name: "firewalld managed", facts: rocky("9.6", "5.14.0-570.el9.x86_64"), probe: map[string]string{"firewalld": "running", "firewalld-zone": kipZone},
			check: "firewall", st: StatusOK, has: "firewalld is active and managed by kip"},
		{name: "firewalld stopped", facts: rocky("9.6", "5.14.0-570.el9.x86_64"), probe: map[string]string{"firewalld": "not running"},
			check: "firewall", st: StatusOK, has: "kip will manage firewalld"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := goodFacts()
			if tc.facts != nil {
				tc.facts(f)
			}
			p, err := parseProbe(probeWith(tc.probe))
			if err != nil {
				t.Fatal(err)
			}
			r := evaluate("203.0.113.10", f, p, tc.want)
			var got *Check
			for i := range r.Checks {
				if r.Checks[i].Name == tc.check {
					got = &r.Checks[i]
				}
			}
			if tc.st == "" {
				if got != nil {
					t.Fatalf("check %s ran: %+v", tc.check, *got)
				}
				return
			}
			if got == nil {
				t.Fatalf("no check %s in %+v", tc.check, r.Checks)
			}
			if got.Status != tc.st || !strings.Contains(got.Detail+" | "+got.Fix, tc.has) {
				t.Errorf("%s: %s %q (fix %q), want %s with %q", tc.check, got.Status, got.Detail, got.Fix, tc.st, tc.has)
			}
			if got.Status != StatusOK && got.Fix == "" {
				t.Errorf("%s: %s without a fix", tc.check, got.Status)
			}
		})
	}
}

func TestPreflightReport(t *testing.T) {
	p, err := parseProbe(labProbe)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("nano passes", func(t *testing.T) {
		r := evaluate("203.0.113.10", goodFacts(), p, Request{})
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range r.Checks {
			names = append(names, c.Name)
		}
		if want := []string{"os", "ipv4", "cpu", "memory", "disk", "profile", "wireguard", "ports", "kubernetes", "firewall"}; !reflect.DeepEqual(names, want) {
			t.Errorf("checks %q, want %q", names, want)
		}
		if r.Sizing.Profile.Name != "nano" || r.Sizing.Storage != cluster.StorageLocal || r.ExistingK3s {
			t.Errorf("sizing %s/%s, existing k3s %v", r.Sizing.Profile.Name, r.Sizing.Storage, r.ExistingK3s)
		}
	})
	t.Run("longhorn on 4 GB", func(t *testing.T) {
		f := goodFacts()
		f.Modules["iscsi_tcp"] = sshx.ModuleUnavailable
		r := evaluate("203.0.113.10", f, p, Request{Storage: cluster.StorageLonghorn})
		err := r.Err()
		want := "preflight failed on 203.0.113.10: 2 checks failed: profile: --storage longhorn needs at least 6000 MiB of RAM; this server has 3900 MiB (fix: resize the server, or install with local storage (omit --storage) and switch later with 'kip cluster storage longhorn'); "
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "; storage modules: Longhorn needs the iscsi_tcp kernel module(s)") {
			t.Errorf("got %v\nwant it to start %q", err, want)
		}
		if r.Sizing != (cluster.Sizing{}) {
			t.Errorf("sizing %+v after a refused profile", r.Sizing)
		}
	})
	t.Run("one failure", func(t *testing.T) {
		f := goodFacts()
		f.MemTotalMiB = 2000
		err := evaluate("h", f, p, Request{}).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "preflight failed on h: 1 check failed: memory: 2000 MiB") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("existing k3s", func(t *testing.T) {
		p, err := parseProbe(probeWith(map[string]string{"paths": "/usr/local/bin/k3s"}))
		if err != nil {
			t.Fatal(err)
		}
		if r := evaluate("h", goodFacts(), p, Request{}); !r.ExistingK3s || r.Err() != nil {
			t.Errorf("existing k3s %v, err %v", r.ExistingK3s, r.Err())
		}
	})
}

// TestProbeReadsHostState: the one probe also reads what install needs of k3s and an unfinished
// install, so that examining a host takes two round trips (facts, probe) rather than four.
func TestProbeReadsHostState(t *testing.T) {
	p, err := parseProbe(probeWith(map[string]string{
		"k3s-version": "k3s version v1.37.2+k3s1 (1a2b3c4d)\n",
		"server-data": "yes\n",
		"k3s-unit":    "ActiveState=active\nUnitFileState=enabled\nInvocationID=0f2c9e\n",
		"intent":      `{"profile":"nano","storage":"local","network":"vxlan","startedBy":"kip install --host h","startedAt":"2026-12-01T10:00:00Z"}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	st := p.state
	if st.k3sVersion != "v1.37.2+k3s1" || !st.serverData || st.unit != (unitState{state: "active", active: true, enabled: true, invocation: "0f2c9e"}) ||
		st.intent == nil || st.intent.Profile != "nano" {
		t.Errorf("host state %+v (intent %+v)", st, st.intent)
	}
	if _, err := parseProbe(probeWith(map[string]string{"intent": "{broken"})); err == nil || !strings.Contains(err.Error(), IntentPath) {
		t.Errorf("a damaged intent file: %v", err)
	}
}
