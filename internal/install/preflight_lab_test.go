package install

import (
	"context"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/lab"
)

// TestPreflightLab runs preflight against a real Debian host of 4096 MiB and 1 CPU, whose
// kernel (this machine's, shared by the container) loads no modules: nano on local storage with
// a WireGuard warning, a refused --storage longhorn, then a port taken, a foreign CNI and an
// active ufw, each found on the host.
func TestPreflightLab(t *testing.T) {
	l := lab.ForTest(t, 1, lab.Options{Hosts: []lab.HostOptions{{MemoryMiB: 4096, CPUs: 1}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := l.Hosts[0]
	c, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	facts, err := c.Facts(ctx, DiskPaths...)
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) {
		t.Helper()
		if out, err := h.Run(ctx, cmd); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	preflight := func(want Request) *Report {
		t.Helper()
		start := time.Now()
		p, err := probeHost(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		r := evaluate(c.Host(), facts, p, want)
		t.Logf("measured: preflight %+v in %s", want, time.Since(start).Round(time.Millisecond))
		for _, ch := range r.Checks {
			t.Logf("  %-16s %-4s %s | %s", ch.Name, ch.Status, ch.Detail, ch.Fix)
		}
		return r
	}
	// The raw output, for the parsers' seeds.
	res, err := c.Run(ctx, sshx.Command("sh", "-c", preflightScript, "kip-preflight", host.FirewalldZone))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("preflight.sh on %s:\n%s", h.Name, res.Stdout)

	t.Run("nano", func(t *testing.T) {
		r := preflight(Request{})
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		if r.Sizing.Profile.Name != "nano" || r.Sizing.Storage != cluster.StorageLocal || r.ExistingK3s {
			t.Errorf("sizing %s/%s, existing k3s %v", r.Sizing.Profile.Name, r.Sizing.Storage, r.ExistingK3s)
		}
		for _, ch := range r.Checks {
			want := StatusOK
			if ch.Name == "wireguard" {
				want = StatusWarn
			}
			if ch.Status != want {
				t.Errorf("%s: %s (%s), want %s", ch.Name, ch.Status, ch.Detail, want)
			}
		}
	})

	t.Run("longhorn", func(t *testing.T) {
		r := preflight(Request{Storage: cluster.StorageLonghorn})
		err := r.Err()
		if err == nil {
			t.Fatal("longhorn on 4096 MiB passed")
		}
		for _, s := range []string{"preflight failed on " + h.PublicIP.String(), "needs at least 6000 MiB", "resize the server",
			// Debian's kernel package has these modules: the fix is a kernel that has them.
			"iscsi_tcp and nfs", "boot a kernel that has iscsi_tcp and nfs"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error lacks %q: %v", s, err)
			}
		}
		if st := status(r, "profile"); st != StatusFail {
			t.Errorf("profile: %s", st)
		}
		if st := status(r, "storage modules"); st != StatusFail {
			t.Errorf("storage modules: %s", st)
		}
	})

	t.Run("port and cni", func(t *testing.T) {
		if err := c.Upload(ctx, "/etc/systemd/system/kip-preflight.socket",
			[]byte("[Socket]\nListenStream=6443\nAccept=yes\n"), 0o644, ""); err != nil {
			t.Fatal(err)
		}
		if err := c.Upload(ctx, "/etc/systemd/system/kip-preflight@.service",
			[]byte("[Service]\nExecStart=/bin/echo kip\nStandardOutput=socket\n"), 0o644, ""); err != nil {
			t.Fatal(err)
		}
		run("systemctl daemon-reload && systemctl start kip-preflight.socket")
		run("mkdir -p /etc/cni/net.d && echo '{}' > /etc/cni/net.d/10-flannel.conflist")
		r := preflight(Request{})
		err := r.Err()
		if err == nil {
			t.Fatal("preflight passed with 6443 taken and a CNI configured")
		}
		for _, s := range []string{"2 checks failed", "6443/tcp (the Kubernetes API) is in use by systemd", "/etc/cni/net.d/10-flannel.conflist"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error lacks %q: %v", s, err)
			}
		}
		run("systemctl stop kip-preflight.socket && rm -r /etc/cni/net.d")
	})

	t.Run("ufw", func(t *testing.T) {
		run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ufw")
		run("ufw allow 22/tcp && ufw --force enable")
		// Only SSH let in: refused, with the commands that fix it; run as written, they do.
		r := preflight(Request{})
		fw := check(r, "firewall")
		fix, ok := strings.CutPrefix(fw.Fix, "on the server run: ")
		fix, _, _ = strings.Cut(fix, "; or turn ufw off")
		if fw.Status != StatusFail || !ok || !strings.Contains(fix, "ufw allow 6443/tcp") || strings.Contains(fix, "22/tcp") {
			t.Fatalf("unmanaged ufw letting in only SSH: %+v", fw)
		}
		run(fix)
		if fw := check(preflight(Request{}), "firewall"); fw.Status != StatusOK {
			t.Errorf("unmanaged ufw after the fix's commands: %+v", fw)
		}
		out, _ := h.Run(ctx, "ufw status")
		t.Logf("ufw status, unmanaged:\n%s", out)
		run(sshx.Command("ufw", "allow", "6443/tcp", "comment", host.FirewallMarker))
		out, _ = h.Run(ctx, "ufw status")
		t.Logf("ufw status, managed:\n%s", out)
		r = preflight(Request{})
		if st := status(r, "firewall"); st != StatusOK {
			t.Errorf("kip-managed ufw: %s", st)
		}
		if err := r.Err(); err != nil {
			t.Error(err)
		}
	})
}

func status(r *Report, name string) Status { return check(r, name).Status }

func check(r *Report, name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}
