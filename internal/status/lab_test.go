package status

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/lab"
)

// TestDoctorLab runs doctor's host checks on a real Debian host, as root over SSH, with the API
// down: certificates placed at k3s's own paths, the host's clock, and its ufw, first managed by
// kip (its rules carry the kip-managed comment), then the operator's; none before ufw is
// installed.
func TestDoctorLab(t *testing.T) {
	l := lab.ForTest(t, 1, lab.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := l.Hosts[0]
	c, err := sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	run := func(cmd string, stdin []byte) {
		t.Helper()
		res, err := c.RunInput(ctx, cmd, bytes.NewReader(stdin))
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
	now := time.Now()
	for path, notAfter := range map[string]time.Time{
		ServerTLSDir + "/serving-kube-apiserver.crt": now.Add(300 * 24 * time.Hour),
		ServerTLSDir + "/server-ca.crt":              now.Add(3650 * 24 * time.Hour),
		AgentDir + "/client-kubelet.crt":             now.Add(-time.Hour),
	} {
		run(sshx.Command("sh", "-c", `mkdir -p "$(dirname "$1")" && cat > "$1"`, "kip-test", path), certPEM(t, filepath.Base(path), notAfter, false))
	}
	dial := func(ctx context.Context, host string) (*sshx.Client, error) {
		return sshx.Dial(ctx, h.SSHConfig(h.PublicIP))
	}
	o := &Options{Out: &bytes.Buffer{}, Server: h.PublicIP.String(), Dial: dial,
		Kube: func() (*kube.Clients, error) { return nil, errors.New("no kubeconfig found") }}
	diagnose := func() *Diagnosis {
		t.Helper()
		start := time.Now()
		d := Diagnose(ctx, o)
		t.Logf("doctor's host checks on %s in %s", h.Name, time.Since(start).Round(time.Millisecond))
		for _, c := range d.Checks {
			t.Logf("  %-8s %-13s %s | %s", c.Status, c.Name, c.Detail, c.Fix)
		}
		return d
	}
	node := h.PublicIP.String()
	d := diagnose()
	if c := findCheck(d, "firewall", node); c == nil || c.Status != StatusOK || !strings.Contains(c.Detail, "no active host firewall") {
		t.Errorf("no firewall: %+v", c)
	}

	run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ufw", nil)
	run(sshx.Command("ufw", "allow", "22/tcp", "comment", host.FirewallMarker)+" && ufw --force enable", nil)
	d = diagnose()
	if c := findCheck(d, "certificates", node); c == nil || c.Status != StatusFail || !strings.Contains(c.Detail, "expired: "+AgentDir+"/client-kubelet.crt") ||
		!strings.Contains(c.Fix, "systemctl restart k3s") {
		t.Errorf("certificates %+v", c)
	}
	if c := findCheck(d, "clock", node); c == nil || c.Status != StatusOK {
		t.Errorf("clock %+v", c)
	}
	if c := findCheck(d, "firewall", node); c == nil || c.Status != StatusOK || c.Detail != "ufw is active and managed by kip" {
		t.Errorf("kip's ufw: %+v", c)
	}
	if c := findCheck(d, "wireguard", node); c == nil || c.Status != StatusWarn {
		t.Errorf("wireguard without modules: %+v", c)
	}

	run("ufw --force reset && ufw allow 22/tcp && ufw --force enable", nil)
	d = diagnose()
	if c := findCheck(d, "firewall", node); c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, "ufw is active and not managed by kip") {
		t.Errorf("the operator's ufw: %+v", c)
	}

	// The API does not answer, and SSH shows why: a k3s unit that exited 1, then one that runs.
	o.Kube = downAPI(t)
	run(sshx.Command("sh", "-c", `cat > /etc/systemd/system/k3s.service && systemctl daemon-reload && { systemctl start k3s || true; }`), []byte(`[Service]
ExecStart=/bin/sh -c 'echo "level=fatal msg=kip-test: k3s cannot start" >&2; exit 1'
`))
	d = diagnose()
	if c := findCheck(d, "k3s service", node); c == nil || c.Status != StatusFail || !strings.Contains(c.Detail, "k3s.service is failed (failed) since ") || !strings.Contains(c.Detail, "last result exit-code (exit status 1)") ||
		!strings.Contains(c.Fix, "systemctl start k3s") || !slices.ContainsFunc(c.Log, func(l string) bool { return strings.Contains(l, "kip-test: k3s cannot start") }) {
		t.Errorf("k3s stopped: %+v", c)
	}
	if c := findCheck(d, "api", ""); c == nil || c.Status != StatusFail || !strings.Contains(c.Fix, "k3s does not run on the server (k3s service below): start k3s on the server: systemctl start k3s;") {
		t.Errorf("api with k3s stopped: %+v", c)
	}
	var out bytes.Buffer
	o.Out = &out
	err = Run(ctx, o)
	t.Logf("kip status with k3s stopped: %v\n%s", err, out.String())
	var down *APIDownError
	if !errors.As(err, &down) || down.Unit == nil || !strings.Contains(err.Error(), "k3s.service is failed (failed)") {
		t.Errorf("status with k3s stopped: %v", err)
	}
	for _, want := range []string{"does not answer: ", "Server " + node + ", over SSH", "✗ k3s.service is failed (failed)", "kip-test: k3s cannot start",
		"fix: start k3s on the server: systemctl start k3s; if it stops again, its log says why: journalctl -u k3s -e"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status text lacks %q", want)
		}
	}

	run(sshx.Command("sh", "-c", `cat > /etc/systemd/system/k3s.service && systemctl daemon-reload && systemctl restart k3s`), []byte("[Service]\nExecStart=/bin/sleep infinity\n"))
	d = diagnose()
	if c := findCheck(d, "k3s service", node); c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, "k3s.service is active (running) since ") ||
		!strings.Contains(c.Detail, "and the API does not answer") || !strings.Contains(c.Fix, "port 6443") {
		t.Errorf("k3s running, the API down: %+v", c)
	}
	if c := findCheck(d, "api", ""); c == nil || !strings.Contains(c.Fix, "k3s runs on the server") {
		t.Errorf("api with k3s running: %+v", c)
	}
}
