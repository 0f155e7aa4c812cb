package e2e_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// The lab host's modprobe pretends to load the modules its pretend line names (lab.HostOptions):
// these take wireguard off it and put it back, for a server whose kernel could not load the
// module when kip installed it and can now.
const (
	noWireGuard   = `sed -i '/^pretend=/s/ wireguard / /' /usr/local/sbin/modprobe`
	withWireGuard = `grep -q '^pretend=.* wireguard ' /usr/local/sbin/modprobe || sed -i 's/^pretend=" /pretend=" wireguard /' /usr/local/sbin/modprobe`
)

// networkMove is spec 002's one-time move of a single-node cluster's pod network from VXLAN to
// WireGuard, on a cluster kip installed while the server could not load the wireguard module
// (h's modprobe then pretended not to, noWireGuard) and that can now:
//   - kip node add refuses, naming kip upgrade; kip upgrade --check says a full upgrade moves it;
//   - with k3s refusing the changed configuration, kip upgrade --yes loads the module (its
//     first write: wireguard now loads at boot), then restores the previous file: k3s and the
//     node come back on VXLAN, the record stays VXLAN;
//   - kip upgrade --skip-system --yes then finishes that upgrade and leaves the network alone
//     (a move that was rolled back is not resumed);
//   - kip upgrade --yes, killed right after the backups and pending marker, then kip upgrade
//     --skip-system --yes (which finishes an interrupted move) killed right after each write it
//     makes and resumed each time: config.yaml names wireguard-native and is otherwise the same
//     file, the node reports flannel on wireguard and is Ready, the record says wireguard-native,
//     no restart is pending.
//
// The pod network itself is the stand-in's: it reports the backend flannel would on the Node,
// and no WireGuard tunnel exists in the lab (docs/testing.md).
func networkMove(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h, worker *lab.Host, c *kube.Clients) {
	t.Helper()
	run := hostRunner(ctx, t, h)
	rec := func() cluster.Record {
		t.Helper()
		r, err := cluster.ReadInstalled(ctx, c.Dynamic)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if n := rec().Network; n != cluster.NetworkVXLAN {
		t.Fatalf("the cluster installed without wireguard runs %q, want VXLAN", n)
	}
	vxlanConfig := run("cat " + k3s.ConfigPath)
	wantConfig, err := k3s.SetFlannelBackend([]byte(vxlanConfig), k3s.FlannelWireGuard)
	if err != nil {
		t.Fatal(err)
	}

	r := s.Kip(t, home, "node", "add", worker.PublicIP.String(), "--yes")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "run 'kip upgrade' first") {
		t.Fatalf("kip node add on a VXLAN cluster: exit %d, want 1 naming kip upgrade\n%s", r.ExitCode, r.Stderr)
	}

	if r = s.Kip(t, home, "upgrade", "--check"); !strings.Contains(r.Stdout, "The pod network runs VXLAN, which no worker can join") {
		t.Errorf("kip upgrade --check on a VXLAN cluster: exit %d, no word of the network\n%s%s", r.ExitCode, r.Stdout, r.Stderr)
	}

	run(withWireGuard)
	killAt := func(pattern string, args ...string) {
		t.Helper()
		r := s.KipEnv(t, home, []string{fault.KillWriteMatchingEnv + "=" + pattern}, args...)
		if r.Signal != syscall.SIGKILL {
			t.Fatalf("kip %s was to be killed right after the write matching %q: exit %d\n%s", strings.Join(args, " "), pattern, r.ExitCode, r.Stderr)
		}
	}

	// k3s refuses the changed configuration: the move is rolled back (having loaded the module
	// and set it to load at boot, its first write).
	run("mkdir -p /etc/k3s-standin && echo refuse-changed-config > /etc/k3s-standin/fault")
	r = s.Kip(t, home, "upgrade", "--yes")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip restored the previous configuration and k3s runs on it again") {
		t.Fatalf("the move refused by k3s: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	run("rm /etc/k3s-standin/fault")
	assertNetwork(ctx, t, c, h, vxlanConfig, cluster.NetworkVXLAN, "vxlan")
	if got := run("cat /etc/modules-load.d/kipper.conf"); !strings.Contains(got, "\nwireguard\n") {
		t.Errorf("the modules loaded at boot lack wireguard:\n%s", got)
	}

	// --skip-system finishes that upgrade without starting the move again (it was rolled back).
	if r = s.Kip(t, home, "upgrade", "--skip-system", "--yes"); r.ExitCode != 0 {
		t.Fatalf("kip upgrade --skip-system after the rollback: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	assertNetwork(ctx, t, c, h, vxlanConfig, cluster.NetworkVXLAN, "vxlan")

	// The move, killed right after its backups and pending marker, then resumed by
	// kip upgrade --skip-system killed right after each write it makes.
	outage := watchAPI(ctx, c)
	killAt(`mkdir -p -m 0700 .* && for f in `, "upgrade", "--yes") // the backups, written with the marker
	r, writes := s.KillEveryWrite(t, home, nil, nil, "upgrade", "--skip-system", "--yes")
	if r.ExitCode != 0 {
		t.Fatalf("kip upgrade --skip-system after the kills: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("the API's longest outage during the move: %s; writes killed after: %q", outage(), writes)
	assertNetwork(ctx, t, c, h, string(wantConfig), cluster.NetworkWireGuard, "wireguard")
}

// assertNetwork checks the server h's config.yaml, the cluster record's network, and that its
// node reports flannel on backend, Ready, with no configuration change pending.
func assertNetwork(ctx context.Context, t *testing.T, c *kube.Clients, h *lab.Host, config, network, backend string) {
	t.Helper()
	if got, err := h.Run(ctx, "cat "+k3s.ConfigPath+"; test ! -e "+k3s.PendingPath+" || echo PENDING"); err != nil || got != config {
		t.Errorf("config.yaml (%v):\n%s\nwant\n%s", err, got, config)
	}
	if r, err := cluster.ReadInstalled(ctx, c.Dynamic); err != nil || r.Network != network {
		t.Errorf("the record's network: %q (%v), want %q", r.Network, err, network)
	}
	if err := poll(ctx, 2*time.Minute, "the server's node on "+backend, func(ctx context.Context) (bool, error) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, h.Name, metav1.GetOptions{})
		return err == nil && n.Annotations["flannel.alpha.coreos.com/backend-type"] == backend && cluster.NodeStatus(n) == cluster.NodeReady, nil
	}); err != nil {
		t.Error(err)
	}
}
