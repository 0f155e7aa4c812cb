package e2e_test

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/upgrade"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/manifests"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// The hosts of the k3s upgrade test: a Longhorn server and two workers that can load wireguard.
const (
	k3sServerHost  = 22 // lab23
	k3sWorkerHost  = 23 // lab24
	k3sWorker2Host = 24 // lab25
)

// TestK3sUpgrade moves a cluster really on Kubernetes 1.36 to 1.37 with kip upgrade --k3s (after
// moving its pod network from VXLAN to WireGuard with kip upgrade: networkMove): the
// k3s stand-in claiming the older release runs that release's real control plane, kubelet and
// kube-proxy (make testenv-older), so the releases the nodes and the API server report are the
// ones their binaries are. The cluster is the one an earlier kip release installed: this kip,
// told to pin the older release (fault.PinEnv), installs the server on it, and both workers join
// on the server's release.
//
//   - While the second worker's join is paused, kip upgrade --check --k3s refuses: a worker is
//     still joining.
//   - On the real older nodes, told to pin two minors ahead, the check refuses the server's move
//     (a control plane moves one minor at a time); told to pin an older release, it refuses the
//     downgrade of every node. Each refusal changes nothing (exit 3 with --check, 1 without).
//   - --check --k3s then reports the plan: the server, then both workers in name order.
//   - kip upgrade --k3s --skip-system runs killed right after each write it makes
//     (Suite.KillEveryWrite: on the hosts each binary's upload, its move into place, each
//     restart; then the console's restarts and the cluster record), each run resuming, until one
//     finishes: every node Ready on the pin, each host's k3s the pin, the API server on
//     1.37, the cluster record naming the pin, the pod on the first worker the same pod (no
//     drain). The API's longest outage while the server restarted is logged.
//   - Run again, it finds every node Ready on the pin and reaches no worker (the server only,
//     for its k3s configuration).
//   - Then the repair of the server's API-server arguments (apiServerRepair).
func TestK3sUpgrade(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	if s.OlderBundle == "" {
		e2e.MissingOlder(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	own := s.Own(t, k3sServerHost, k3sWorkerHost, k3sWorker2Host)
	srv, w1, w2 := own[0], own[1], own[2]
	for _, h := range own {
		e2e.LogK3sOnFailure(t, h)
	}
	pinned, err := manifests.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	k3sPin, err := pinned.Component("k3s")
	if err != nil {
		t.Fatal(err)
	}
	pin := k3sPin.Version
	earlier := []string{fault.PinEnv + "=k3s=" + e2e.OlderK3s}

	// The cluster an earlier kip installed, on the older release.
	home := s.Home(t)
	if err := e2e.UploadChartFixtures(ctx, srv); err != nil {
		t.Fatal(err)
	}
	if out, err := srv.Run(ctx, noWireGuard); err != nil { // the server's kernel could not load it then
		t.Fatalf("%v\n%s", err, out)
	}
	if r := s.KipEnv(t, home, earlier, installArgs(s, srv, s.OlderBundle, "--storage", "longhorn")...); r.ExitCode != 0 {
		t.Fatalf("install on %s: exit %d\n%s", e2e.OlderK3s, r.ExitCode, r.Stderr)
	}
	c := clientsFor(t, filepath.Join(home, "kubeconfigs", srv.PublicIP.String()+".yaml"))
	networkMove(ctx, t, s, home, srv, w1, c)
	authorize(t, srv, w1)
	authorize(t, srv, w2)
	join := func(w *lab.Host) []string {
		return []string{"node", "add", w.PublicIP.String(), "--airgap-bundle", s.OlderBundle, "--yes"}
	}
	if r := joinWithLonghorn(ctx, t, s, home, c, srv, w1, nil, join(w1)...); r.ExitCode != 0 {
		t.Fatalf("join %s: exit %d\n%s", w1.Name, r.ExitCode, r.Stderr)
	}
	r := joinWithLonghornPaused(ctx, t, s, home, c, srv, w2, nil, func() {
		r := s.Kip(t, home, "upgrade", "--check", "--k3s")
		if want := "worker " + w2.Name + " is still joining"; r.ExitCode != 3 || !strings.Contains(r.Stdout, want) {
			t.Errorf("kip upgrade --check --k3s while %s joins: exit %d, want 3 and %q\n%s%s", w2.Name, r.ExitCode, want, r.Stdout, r.Stderr)
		}
	}, join(w2)...)
	if r.ExitCode != 0 {
		t.Fatalf("join %s: exit %d\n%s", w2.Name, r.ExitCode, r.Stderr)
	}
	for _, h := range own {
		if n := readyNode(ctx, t, c, h.Name); n.Status.NodeInfo.KubeletVersion != e2e.OlderK3s {
			t.Fatalf("node %s reports %s, want %s from the older release's kubelet", h.Name, n.Status.NodeInfo.KubeletVersion, e2e.OlderK3s)
		}
	}
	if v := serverVersion(t, c); !strings.HasPrefix(v, olderKubernetes()) {
		t.Fatalf("the API server reports %s, want %s", v, olderKubernetes())
	}
	// A pod on the first worker, which the upgrade does not drain.
	pod := runPodOn(ctx, t, c, w1.Name)

	// The refusals of spec 002 on the real older nodes: nothing changes.
	for _, tc := range []struct{ pin, want string }{
		{"v1.38.1+k3s1", "k3s " + e2e.OlderK3s + " on the server is 2 Kubernetes minors behind v1.38.1+k3s1"},
		{"v1.35.4+k3s1", "runs k3s " + e2e.OlderK3s + ", newer than v1.35.4+k3s1, which this kip pins, and kip never downgrades k3s"},
	} {
		env := []string{fault.PinEnv + "=k3s=" + tc.pin}
		r := s.KipEnv(t, home, env, "upgrade", "--check", "--k3s")
		if r.ExitCode != 3 || !strings.Contains(r.Stdout, tc.want) {
			t.Errorf("kip upgrade --check --k3s pinning %s: exit %d, want 3 and %q\n%s%s", tc.pin, r.ExitCode, tc.want, r.Stdout, r.Stderr)
		}
		r = s.KipEnv(t, home, env, "upgrade", "--k3s", "--yes", "--skip-system", "--airgap-bundle", s.Bundle)
		if r.ExitCode != 1 || !strings.Contains(r.Stderr, "k3s cannot move: ") || !strings.Contains(r.Stderr, "Nothing was changed") {
			t.Errorf("kip upgrade --k3s pinning %s: exit %d\n%s", tc.pin, r.ExitCode, r.Stderr)
		}
	}
	for _, h := range own {
		if got, err := h.Run(ctx, "k3s --version | head -1"); err != nil || !strings.Contains(got, e2e.OlderK3s) {
			t.Errorf("k3s on %s after the refusals: %q, %v", h.Name, got, err)
		}
	}

	// The plan.
	r = s.Kip(t, home, "upgrade", "--check", "--k3s")
	for _, want := range []string{
		"k3s: the server moves from " + e2e.OlderK3s + " to " + pin + " first",
		"k3s: then workers " + w1.Name + ", " + w2.Name + " to " + pin + ", one at a time, without a drain",
	} {
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, want) {
			t.Errorf("kip upgrade --check --k3s: exit %d, want 0 and %q\n%s%s", r.ExitCode, want, r.Stdout, r.Stderr)
		}
	}

	// The upgrade, killed after each write it makes, resumed each time.
	outage := watchAPI(ctx, c)
	args := []string{"upgrade", "--k3s", "--yes", "--skip-system", "--airgap-bundle", s.Bundle, "-v"}
	var first string
	r, writes := s.KillEveryWrite(t, home, nil, func(_ string, r e2e.Result) {
		if first == "" {
			first = r.Stderr
		}
	}, args...)
	if r.ExitCode != 0 {
		t.Fatalf("kip %s after the kills: exit %d\n%s", strings.Join(args, " "), r.ExitCode, r.Stderr)
	}
	var onHosts []string
	for _, w := range writes {
		if strings.HasPrefix(w, "ssh ") {
			onHosts = append(onHosts, w)
		}
	}
	if len(onHosts) < 9 { // per node at least the binary's upload, its move into place, the restart
		t.Errorf("the upgrade was killed after %d writes on the hosts, want every node's upload, move and restart: %q", len(onHosts), writes)
	}
	if !strings.Contains(first, "ssh: connecting to "+srv.PublicIP.String()) {
		t.Errorf("the first run of the upgrade did not say (-v) that it reached the server over SSH:\n%s", first)
	}
	t.Logf("the API's longest outage during the upgrade: %s", outage())

	for _, h := range own {
		if n := readyNode(ctx, t, c, h.Name); n.Status.NodeInfo.KubeletVersion != pin {
			t.Errorf("node %s reports %s after the upgrade, want %s", h.Name, n.Status.NodeInfo.KubeletVersion, pin)
		}
		if got, err := h.Run(ctx, "k3s --version | head -1"); err != nil || !strings.Contains(got, pin) {
			t.Errorf("k3s on %s after the upgrade: %q, %v", h.Name, got, err)
		}
	}
	if v := serverVersion(t, c); strings.HasPrefix(v, olderKubernetes()) {
		t.Errorf("the API server still reports %s", v)
	}
	if rec, err := cluster.ReadInstalled(ctx, c.Dynamic); err != nil || rec.Versions["k3s"] != pin {
		t.Errorf("the cluster record's k3s after the upgrade: %q (%v), want %s", rec.Versions["k3s"], err, pin)
	}
	if p, err := c.Kube.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || p.UID != pod.UID {
		t.Errorf("the pod on %s after the upgrade: %v (drained or replaced)", w1.Name, err)
	}
	if p, err := workflow.Unfinished(ctx, c.Dynamic, kube.ClusterRecords(), upgrade.Workflow, nil); err != nil || p != nil {
		t.Errorf("the upgrade's progress record is not finished: %+v, %v", p, err)
	}

	// Run again: every node is Ready on the pin, and only the server is reached, to read its
	// k3s configuration.
	r = s.Kip(t, home, args...)
	for _, want := range []string{"The server already Ready on k3s " + pin, "Worker " + w1.Name + " already Ready on k3s " + pin, "Worker " + w2.Name + " already Ready on k3s " + pin} {
		if r.ExitCode != 0 || !strings.Contains(r.Stderr, want) {
			t.Errorf("kip upgrade --k3s again: exit %d, want %q\n%s", r.ExitCode, want, r.Stderr)
		}
	}
	// SSH round trips of a no-op upgrade (the figure): the server's identity and
	// config.yaml, its files' state.
	m := regexp.MustCompile(`(\d+) remote commands on the server over SSH`).FindStringSubmatch(r.Stderr)
	n := -1
	if m != nil {
		n, _ = strconv.Atoi(m[1])
	}
	if n < 0 || n > 10 {
		t.Errorf("a no-op kip upgrade -v: want at most 10 remote commands on the server, counted\n%s", r.Stderr)
	}
	t.Logf("a no-op kip upgrade: %d remote commands on the server", n)
	for _, w := range []*lab.Host{w1, w2} {
		if strings.Contains(r.Stderr, "ssh: connecting to "+w.PublicIP.String()) {
			t.Errorf("kip upgrade --k3s on a cluster already on the pin reached worker %s over SSH:\n%s", w.Name, r.Stderr)
		}
	}

	apiServerRepair(ctx, t, s, home, srv, c)
}

// olderKubernetes is the Kubernetes release of e2e.OlderK3s.
func olderKubernetes() string {
	v, _, _ := strings.Cut(e2e.OlderK3s, "+")
	return v
}

func serverVersion(t *testing.T, c *kube.Clients) string {
	t.Helper()
	v, err := c.Kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.GitVersion
}

// readyNode waits up to five minutes for node name to be Ready and returns it.
func readyNode(ctx context.Context, t *testing.T, c *kube.Clients, name string) *corev1.Node {
	t.Helper()
	var n *corev1.Node
	if err := poll(ctx, 5*time.Minute, "node "+name+" Ready", func(ctx context.Context) (bool, error) {
		var err error
		n, err = c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && cluster.NodeStatus(n) == cluster.NodeReady, nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// runPodOn runs a pod on node until it is Running.
func runPodOn(ctx context.Context, t *testing.T, c *kube.Clients, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "k3s-upgrade-" + node, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:    node,
			Containers:  []corev1.Container{{Name: "sleep", Image: busyboxImage, Command: []string{"sleep", "infinity"}}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	p, err := c.Kube.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 5*time.Minute, "pod "+p.Name+" Running", func(ctx context.Context) (bool, error) {
		got, err := c.Kube.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// watchAPI asks the API server's /readyz every 200 ms until ctx ends, and returns a function
// that reports the longest time it did not answer ok.
func watchAPI(ctx context.Context, c *kube.Clients) func() time.Duration {
	var mu sync.Mutex
	var longest time.Duration
	go func() {
		lastOK := time.Now()
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			body, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
			cancel()
			now := time.Now()
			if err == nil && strings.TrimSpace(string(body)) == "ok" {
				lastOK = now
			} else {
				mu.Lock()
				longest = max(longest, now.Sub(lastOK))
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return longest.Round(100 * time.Millisecond)
	}
}
