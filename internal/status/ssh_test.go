package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/sshd"
)

// sshHost is a real sshd on this machine standing in for the server: its k3s directories are
// temporary ones, filled with certificates and volume directories the test places.
type sshHost struct {
	srv   *sshd.Server
	paths hostPaths
	dial  DialFunc
}

func newSSHHost(t *testing.T) *sshHost {
	t.Helper()
	srv := sshd.Start(t)
	dir := t.TempDir()
	h := &sshHost{srv: srv, paths: hostPaths{
		serverTLS: filepath.Join(dir, "server", "tls"),
		agent:     filepath.Join(dir, "agent"),
		storage:   filepath.Join(dir, "storage"),
	}}
	for _, d := range []string{h.paths.serverTLS, h.paths.agent, h.paths.storage} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	saved := k3sPaths
	k3sPaths = h.paths
	t.Cleanup(func() { k3sPaths = saved })
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	var clients []*sshx.Client
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	// Only the server answers: any other address is refused at once, as an unreachable worker.
	h.dial = func(ctx context.Context, host string) (*sshx.Client, error) {
		if host != srv.Host {
			return nil, fmt.Errorf("dial tcp %s:22: connect: no route to host", host)
		}
		c, err := sshx.Dial(ctx, sshx.Config{Host: srv.Host, Port: srv.Port, User: sshd.User, KeyPath: srv.ClientKeyPath,
			KnownHostsPath: knownHosts, Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}
	return h
}

// cert writes a certificate file expiring at notAfter.
func (h *sshHost) cert(t *testing.T, dir, name string, notAfter time.Time) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), certPEM(t, name, notAfter, false), 0o600); err != nil {
		t.Fatal(err)
	}
}

// volume writes a volume directory holding size bytes.
func (h *sshHost) volume(t *testing.T, name string, size int) {
	t.Helper()
	d := filepath.Join(h.paths.storage, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "data"), bytes.Repeat([]byte{1}, size), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestHostChecksSSH runs doctor's host checks over SSH on a real sshd, first with the API down
// (the host checks still run on the saved server), then with the API: certificates placed with
// known expiry dates, the host's clock, its firewall; and status's local volumes read with du.
func TestHostChecksSSH(t *testing.T) {
	h := newSSHHost(t)
	ctx := context.Background()
	now := time.Now()
	day := 24 * time.Hour
	h.cert(t, h.paths.serverTLS, "serving-kube-apiserver.crt", now.Add(300*day))
	h.cert(t, h.paths.serverTLS, "client-admin.crt", now.Add(10*day))
	h.cert(t, h.paths.agent, "client-kubelet.crt", now.Add(200*day))

	t.Run("api down", func(t *testing.T) {
		var out bytes.Buffer
		o := &Options{Out: &out, Server: h.srv.Host, Dial: h.dial, KipVersion: recordKip,
			Kube: func() (*kube.Clients, error) { return nil, errors.New("no kubeconfig found") }}
		start := time.Now()
		d := Diagnose(ctx, o)
		t.Logf("doctor with the API down, over SSH, in %s", time.Since(start).Round(time.Millisecond))
		for _, c := range d.Checks {
			t.Logf("%-8s %-13s %-10s %s | %s", c.Status, c.Name, c.Node, c.Detail, c.Fix)
		}
		if c := findCheck(d, "api", ""); c == nil || c.Status != StatusFail {
			t.Errorf("api check %+v", c)
		}
		node := h.srv.Host
		c := findCheck(d, "certificates", node)
		if c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, filepath.Join(h.paths.serverTLS, "client-admin.crt")) || !strings.Contains(c.Fix, "systemctl restart k3s") {
			t.Errorf("certificates %+v", c)
		}
		if c := findCheck(d, "clock", node); c == nil || c.Status != StatusOK || !strings.Contains(c.Detail, "this machine's") {
			t.Errorf("host clock %+v", c)
		}
		for _, name := range []string{"firewall", "wireguard", "disk"} {
			if c := findCheck(d, name, node); c == nil || c.Status == StatusSkipped {
				t.Errorf("%s check %+v", name, c)
			}
		}
		if err := Doctor(ctx, o); err == nil {
			t.Fatal("doctor passed with the API down")
		}
		if !strings.Contains(out.String(), "! certificates ("+node+"): expiring within 30 days") {
			t.Errorf("text:\n%s", out.String())
		}
	})

	t.Run("expired", func(t *testing.T) {
		h.cert(t, h.paths.agent, "client-kube-proxy.crt", now.Add(-time.Hour))
		t.Cleanup(func() { os.Remove(filepath.Join(h.paths.agent, "client-kube-proxy.crt")) })
		o := &Options{Out: &bytes.Buffer{}, Server: h.srv.Host, Dial: h.dial,
			Kube: func() (*kube.Clients, error) { return nil, errors.New("no kubeconfig found") }}
		d := Diagnose(ctx, o)
		c := findCheck(d, "certificates", h.srv.Host)
		if c == nil || c.Status != StatusFail || !strings.Contains(c.Detail, "expired: "+filepath.Join(h.paths.agent, "client-kube-proxy.crt")) {
			t.Fatalf("certificates %+v", c)
		}
	})

	t.Run("with the api", func(t *testing.T) {
		f := newFixture(t)
		h.volume(t, "pvc-ssh_shop_files", 1<<20)
		h.volume(t, "pvc-old_shop_data-db-0", 3<<20) // a copy kept after a move: no PersistentVolume
		if err := f.createLocalPV(h.paths.storage, srvNode, "pvc-ssh", "shop", "files", "1Gi"); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		o := f.options(&out)
		o.Server, o.Dial = h.srv.Host, h.dial

		r, err := Collect(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		s := findNode(t, r, srvNode).Storage
		if s == nil || len(s.Disks) != 1 || s.Disks[0].TotalBytes == 0 {
			t.Fatalf("server storage %+v", s)
		}
		vol := func(name string) Volume {
			i := slices.IndexFunc(s.Volumes, func(v Volume) bool { return v.Name == name })
			if i < 0 {
				t.Fatalf("volume %s not listed: %+v", name, s.Volumes)
			}
			return s.Volumes[i]
		}
		if v := vol("pvc-old"); !v.Orphaned || v.Namespace != "shop" || v.Claim != "data-db-0" || v.UsedBytes == nil || *v.UsedBytes < 3<<20 {
			t.Errorf("kept copy %+v", v)
		}
		if v := vol("pvc-ssh"); v.Orphaned || v.UsedBytes == nil || *v.UsedBytes < 1<<20 || *v.UsedBytes > 2<<20 || v.SizeBytes != 1<<30 {
			t.Errorf("volume %+v", v)
		}
		if v := vol("pvc-db"); v.UsedBytes != nil {
			t.Errorf("a volume without a directory has a size: %+v", v)
		}
		if slices.ContainsFunc(r.Skipped, func(s string) bool { return strings.Contains(s, "free disk") }) {
			t.Errorf("skipped %q", r.Skipped)
		}
		if err := Run(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Logf("kip status:\n%s", out.String())

		d := Diagnose(ctx, o)
		for _, c := range d.Checks {
			t.Logf("%-8s %-13s %-10s %s | %s", c.Status, c.Name, c.Node, c.Detail, c.Fix)
		}
		if c := findCheck(d, "certificates", srvNode); c == nil || c.Status != StatusWarn {
			t.Errorf("server certificates %+v", c)
		}
		if c := findCheck(d, "disk", srvNode); c == nil || !strings.Contains(c.Detail, "holding "+h.paths.storage) && !strings.Contains(c.Detail, "holding /var/lib/rancher") {
			t.Errorf("disk %+v", c)
		}
		if c := findCheck(d, "ssh", deadNode); c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, "192.0.2.12") || !strings.Contains(c.Fix, "--ssh-key") {
			t.Errorf("unreachable worker %+v", c)
		}
		if c := findCheck(d, "host checks", fencedNode); c == nil || c.Status != StatusSkipped {
			t.Errorf("worker without an address %+v", c)
		}
	})
}
