package status

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/sshd"
)

// sshHost is a real sshd on this machine standing in for the server: its k3s directories are
// temporary ones, filled with certificates and volume directories the test places.
type sshHost struct {
	srv        *sshd.Server
	paths      hostPaths
	dial       DialFunc
	knownHosts string // kip's known_hosts for this host
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
	h.knownHosts = knownHosts
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
		// A worker kip joined, whose host does not answer: status names it.
		if _, err := cluster.UpdateNodes(ctx, f.c.Dynamic, func(n *cluster.Nodes) error {
			n.Workers = map[string]cluster.Worker{deadNode: {Host: "192.0.2.12", State: cluster.WorkerReady}}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cluster.UpdateNodes(context.Background(), f.c.Dynamic, func(n *cluster.Nodes) error { n.Workers = nil; return nil }) //nolint:errcheck // the next fixture starts over
		})
		var out bytes.Buffer
		o := f.options(&out)
		o.Server, o.Dial = h.srv.Host, h.dial

		r, err := Collect(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// The host checks ran on the server and on the recorded worker.
		hostCheck := func(name, node string) *Check {
			i := slices.IndexFunc(r.HostChecks, func(c Check) bool { return c.Name == name && c.Node == node })
			if i < 0 {
				t.Fatalf("no %s check on %s in %+v", name, node, r.HostChecks)
			}
			return &r.HostChecks[i]
		}
		if c := hostCheck("certificates", srvNode); c.Status != StatusWarn || !strings.Contains(c.Detail, "client-admin.crt") {
			t.Errorf("server certificates %+v", c)
		}
		for _, name := range []string{"clock", "firewall", "disk"} {
			if c := hostCheck(name, srvNode); c.Status == StatusSkipped {
				t.Errorf("%s check %+v", name, c)
			}
		}
		if c := hostCheck("ssh", deadNode); c.Status != StatusWarn || !strings.Contains(c.Detail, "192.0.2.12") {
			t.Errorf("unreachable worker %+v", c)
		}
		if !slices.ContainsFunc(r.Warnings, func(w string) bool {
			return strings.HasPrefix(w, "ssh ("+deadNode+"): cannot reach "+deadNode+" (192.0.2.12) over SSH")
		}) || !slices.ContainsFunc(r.Warnings, func(w string) bool {
			return strings.HasPrefix(w, "certificates ("+srvNode+"): expiring within 30 days")
		}) {
			t.Errorf("warnings %q", r.Warnings)
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
		for _, want := range []string{`\nHost checks\n`, `\n  ! ` + srvNode + `: [^\n]*certificates[^\n]* not right \(see Warnings\), \d+ passed\n`,
			`\n  ! ` + deadNode + `: ssh not right \(see Warnings\), 0 passed\n`} {
			if !regexp.MustCompile(want).MatchString(out.String()) {
				t.Errorf("kip status does not match %q", want)
			}
		}

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

// downAPI returns clients of an API server that does not answer: nothing listens on the port.
func downAPI(t *testing.T) func() (*kube.Clients, error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := kube.NewClients(&rest.Config{Host: "https://" + addr, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return func() (*kube.Clients, error) { return c, nil }
}

// TestChangedHostKey has the server's host key change after kip trusted it: doctor fails the
// ssh check with how to verify the new key and the command that forgets the old one, which
// works as written; status warns the same way.
func TestChangedHostKey(t *testing.T) {
	h := newSSHHost(t)
	ctx := context.Background()
	h.cert(t, h.paths.serverTLS, "serving-kube-apiserver.crt", time.Now().Add(300*24*time.Hour))
	h.cert(t, h.paths.agent, "client-kubelet.crt", time.Now().Add(300*24*time.Hour))
	o := &Options{Out: &bytes.Buffer{}, Server: h.srv.Host, Dial: h.dial, Kube: downAPI(t)}
	node := h.srv.Host
	if c := findCheck(Diagnose(ctx, o), "certificates", node); c == nil || c.Status != StatusOK {
		t.Fatalf("first connection: certificates %+v", c)
	}

	h.srv.RestartWithNewHostKey(t)
	d := Diagnose(ctx, o)
	c := findCheck(d, "ssh", node)
	forget := fmt.Sprintf("ssh-keygen -f %s -R '[127.0.0.1]:%d'", h.knownHosts, h.srv.Port)
	if c == nil || c.Status != StatusFail || !strings.Contains(c.Detail, "has changed") || strings.Contains(c.Fix, "--ssh-key") ||
		!strings.Contains(c.Fix, "cat /etc/ssh/ssh_host_*_key.pub | ssh-keygen -lf -") || !strings.Contains(c.Fix, "known_hosts with: "+forget+" ;") {
		t.Fatalf("changed host key: %+v", c)
	}
	var failed *FailedError
	if err := Doctor(ctx, o); !errors.As(err, &failed) {
		t.Fatalf("doctor with a changed host key: %v", err)
	}

	// Status, through the API, reads the server's volumes over SSH: it warns with the same fix.
	f := newFixture(t)
	so := f.options(&bytes.Buffer{})
	so.Server, so.Dial = h.srv.Host, h.dial
	r, err := Collect(ctx, so)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(r.Warnings, func(w string) bool { return strings.Contains(w, "has changed") && strings.Contains(w, forget) }) ||
		slices.ContainsFunc(r.Skipped, func(s string) bool { return strings.Contains(s, "--ssh-key") }) {
		t.Errorf("status: warnings %q, skipped %q", r.Warnings, r.Skipped)
	}
	// With the API down, status says so and why it could not look at k3s.
	o.Out = &bytes.Buffer{}
	var down *APIDownError
	if err := Run(ctx, o); !errors.As(err, &down) || !strings.Contains(err.Error(), forget) {
		t.Errorf("status with the API down: %v", err)
	}

	// The command, run as written, forgets the old key: kip trusts the new one and goes on.
	if out, err := exec.Command("sh", "-c", forget).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", forget, err, out)
	}
	d = Diagnose(ctx, o)
	if c := findCheck(d, "ssh", node); c != nil {
		t.Errorf("after %s: %+v", forget, c)
	}
	if c := findCheck(d, "certificates", node); c == nil || c.Status != StatusOK {
		t.Errorf("after %s: certificates %+v", forget, c)
	}
}

// TestAPIDownSSH has the API down and SSH up: doctor and status look at k3s's unit over SSH.
// This sshd's host runs no systemd, so they say they cannot read it; TestDoctorLab reads a real
// unit.
func TestAPIDownSSH(t *testing.T) {
	h := newSSHHost(t)
	ctx := context.Background()
	var out bytes.Buffer
	o := &Options{Out: &out, Server: h.srv.Host, Dial: h.dial, Kube: downAPI(t)}
	d := Diagnose(ctx, o)
	if c := findCheck(d, "api", ""); c == nil || c.Status != StatusFail || !strings.Contains(c.Detail, "connection refused") {
		t.Errorf("api %+v", c)
	}
	if c := findCheck(d, "k3s service", h.srv.Host); c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, "cannot read the state of k3s.service") {
		t.Errorf("k3s service %+v", c)
	}
	err := Run(ctx, o)
	var down *APIDownError
	if !errors.As(err, &down) || down.Unit == nil || down.Unit.Error == "" {
		t.Fatalf("status: %v (%+v)", err, down)
	}
	for _, want := range []string{"API: " + down.API + " does not answer: ", "connection refused", "Server " + h.srv.Host + ", over SSH", "! cannot read the state of k3s.service: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.HasPrefix(err.Error(), "the cluster's API at "+down.API+" does not answer (") || !strings.Contains(err.Error(), "; over SSH, on the server "+h.srv.Host+": cannot read the state of k3s.service: ") {
		t.Errorf("error %q", err)
	}
}
