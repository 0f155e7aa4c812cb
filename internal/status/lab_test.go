package status

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
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
}
