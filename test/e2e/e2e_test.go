package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// k3sModules are the kernel modules every k3s server loads, which the lab's kernel lacks: the
// install hosts pretend to load them (see lab.HostOptions.Modules).
var k3sModules = []string{"br_netfilter", "overlay"}

// Hosts 1–3 form the stand-in cluster test's cluster; host 4 is the k3s configuration test's;
// host 5 (4 GiB) is the nano install's and host 6 (8 GiB, with the kernel modules Longhorn
// needs and its own 40 GiB disk at /var/lib/longhorn) the Longhorn install's; host 7 runs Velero
// for the backup test, host 8 the data mover's pods, host 9 the Longhorn stand-in's, host 10
// the service moves', hosts 11 and 12 the node test's server and worker, host 13 the move
// rollbacks', host 14 the node test's second worker, hosts 15 and 16 the public-mode node
// test's server and worker, hosts 17 and 18 the fence test's, host 19 the moves on a cluster
// with backups, host 20 (as host 5) the nano cluster after its install, host 21 the moves
// killed after single writes, host 22 restore-dump's, and hosts 23 to 25 the k3s upgrade's
// server and workers. Each test has its own hosts, so the tests run in parallel (go test -parallel, set
// in the Makefile); hosts 1 and 2 only serve the node tests as hosts outside their clusters,
// which the stand-in cluster test running beside them does not disturb.
func TestMain(m *testing.M) {
	os.Exit(e2e.Main(m, 26, lab.Options{Hosts: []lab.HostOptions{
		{}, {}, {}, {},
		// The nano host grows onto Longhorn at the end: it can load Longhorn's modules and has
		// its own disk at /var/lib/longhorn.
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs"}, k3sModules...), LonghornDiskGiB: 20},
		{MemoryMiB: 8192, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs"}, k3sModules...), LonghornDiskGiB: 40},
		{}, {}, {}, {},
		// The node test's server and worker: Longhorn hosts that can load wireguard.
		{MemoryMiB: 8192, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 20},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		{},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		// The public-mode node test's server and worker.
		{MemoryMiB: 8192, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 20},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		// The fence test's server and worker.
		{MemoryMiB: 8192, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 20},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		{}, // the moves on a cluster with backups
		// The nano cluster after its install: as the nano install's host.
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs"}, k3sModules...), LonghornDiskGiB: 20},
		{}, // the moves killed after single writes
		{}, // restore-dump's
		// The k3s upgrade's server and workers: Longhorn hosts that can load wireguard.
		{MemoryMiB: 8192, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 20},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		{MemoryMiB: 4096, CPUs: 2, Modules: append([]string{"iscsi_tcp", "nfs", "wireguard"}, k3sModules...), LonghornDiskGiB: 10},
		{}, // the Longhorn stand-in's releases
	}}))
}

// TestKipRunsAsASubprocess checks the harness's own plumbing: kip built from this checkout,
// run with its own KIP_HOME and no terminal.
func TestKipRunsAsASubprocess(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	home := s.Home(t)
	r := s.Kip(t, home, "version", "-o", "json")
	if r.ExitCode != 0 {
		t.Fatalf("kip version exited %d: %s", r.ExitCode, r.Stderr)
	}
	var v struct {
		Kip struct{ Version, Commit string }
	}
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil || v.Kip.Version == "" {
		t.Fatalf("kip version -o json: %v\n%s", err, r.Stdout)
	}
	if r := s.Kip(t, home, "--bogus"); r.ExitCode != 2 || !strings.Contains(r.Stderr, "unknown flag") {
		t.Fatalf("a bad flag: exit %d, %q", r.ExitCode, r.Stderr)
	}
}

// TestStandinClusterUnderSystemd runs the k3s stand-in as k3s runs: a server on lab1 and agents
// on lab2 and lab3 under systemd units, each with a real containerd, kubelet and kube-proxy. The
// API answers at the server's private address, a Node per host turns Ready, local-path claims
// are directories on each host's disk, pods reach each other across hosts by IP and by Service
// name, and a host that dies takes its containers with it and brings them back when it boots.
func TestStandinClusterUnderSystemd(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// lab1 and lab2 stay up for the node tests, which probe from them: only their k3s stops at
	// the end, so that the cluster takes no CPU from the tests still running.
	server, a1, a2 := s.Lab.Hosts[0], s.Lab.Hosts[1], s.Own(t, 2)[0]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for h, unit := range map[*lab.Host]string{server: "k3s", a1: "k3s-agent"} {
			if out, err := h.Run(ctx, "systemctl stop "+unit); err != nil {
				t.Errorf("stop %s on %s at the end of the test: %v\n%s", unit, h.Name, err, out)
			}
		}
	})

	start := time.Now()
	err := s.InstallStandin(ctx, server, "server", e2e.ServerConfig(server))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-in server on %s ready %s after its unit started", server.Name, time.Since(start).Round(100*time.Millisecond))

	out, err := server.Run(ctx, "k3s --version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "k3s version v1.37.2+k3s1 ") {
		t.Fatalf("k3s --version printed %q", out)
	}
	mode, err := server.Run(ctx, "stat -L -c %a /etc/rancher/k3s/k3s.yaml /var/lib/rancher/k3s/server/node-token")
	if err != nil || strings.Fields(mode)[0] != "600" || strings.Fields(mode)[1] != "600" {
		t.Fatalf("kubeconfig and token modes %q, %v; want 600 600", mode, err)
	}
	token, err := server.Run(ctx, "cat /var/lib/rancher/k3s/server/node-token")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []*lab.Host{a1, a2} {
		cfg := fmt.Sprintf("server: https://%s:6443\ntoken: %s\nnode-ip: %s\n", server.PrivateIP, strings.TrimSpace(token), h.PrivateIP)
		if err := s.InstallStandin(ctx, h, "agent", cfg); err != nil {
			t.Fatal(err)
		}
	}

	names := []string{server.Name, a1.Name, a2.Name}
	_, _, c := s.Clients(ctx, t, server, names...)
	node, err := c.Kube.CoreV1().Nodes().Get(ctx, server.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodeAddress(node, corev1.NodeInternalIP); got != server.PrivateIP.String() {
		t.Errorf("server Node InternalIP %q, want %s", got, server.PrivateIP)
	}

	t.Run("LocalPath", func(t *testing.T) { testLocalPath(ctx, t, c, []*lab.Host{server, a1, a2}) })
	t.Run("PodNetwork", func(t *testing.T) { testPodNetwork(ctx, t, c, server, a1) })
	for _, h := range []*lab.Host{server, a1, a2} {
		rss, err := h.RSS()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("measured: %s's anonymous memory (its cgroup's RSS: systemd, sshd, the stand-in and its children, containers): %d MiB", h.Name, rss>>20)
	}

	// A container on every node, its node's name in its command line.
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "marker", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "marker"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "marker"}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: "marker", Image: busybox,
						Command: []string{"sh", "-c", `exec sh -c 'while :; do sleep 1; done' "kip-e2e-marker-on-$NODE_NAME"`},
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
					}},
				},
			},
		},
	}
	if _, err := c.Kube.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitRollout(ctx, c, "DaemonSet", "default", "marker", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	marker := "kip-e2e-marker-on-" + a2.Name
	waitContainer(ctx, t, marker, true, time.Minute)

	// A worker killed outright goes NotReady like a dead kubelet's node, its containers stop with
	// it, and it comes back Ready, its containers running again, when its host boots again and
	// systemd restarts the enabled agent.
	if err := a2.Kill(); err != nil {
		t.Fatal(err)
	}
	waitContainer(ctx, t, marker, false, time.Minute)
	waitNodeReady(ctx, t, c, a2.Name, corev1.ConditionUnknown, 2*time.Minute)
	booted := time.Now()
	if err := a2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitNodesReady(ctx, c, []string{a2.Name}, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: host boot to its Node Ready: %s", time.Since(booted).Round(100*time.Millisecond))
	waitContainer(ctx, t, marker, true, 3*time.Minute)
	t.Logf("measured: host boot to its containers running again: %s", time.Since(booted).Round(100*time.Millisecond))

	// A drop-in that keeps the agent from starting holds across a restart, as kip's fence needs.
	dropIn := "mkdir -p /etc/systemd/system/k3s-agent.service.d && printf '[Service]\\nExecStartPre=/bin/false\\n' > /etc/systemd/system/k3s-agent.service.d/fence.conf && systemctl daemon-reload"
	if _, err := a1.Run(ctx, dropIn); err != nil {
		t.Fatal(err)
	}
	if _, err := a1.Run(ctx, "systemctl restart k3s-agent"); err == nil {
		t.Fatal("k3s-agent restarted despite a drop-in that keeps it from starting")
	}
	waitNodeReady(ctx, t, c, a1.Name, corev1.ConditionUnknown, 2*time.Minute)
}

// TestK3sConfigTakesEffect runs a k3s server on the configuration kip renders: its API server
// writes the metadata-only audit log where kip says, and the Node carries the pod network
// backend kip chose.
func TestK3sConfigTakesEffect(t *testing.T) {
	t.Parallel()
	s := e2e.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h := s.Own(t, 3)[0]
	cfg, err := k3s.ServerConfig{
		NodeIP: h.PrivateIP.String(), NodeExternalIP: h.PublicIP.String(),
		FlannelBackend: k3s.FlannelVXLAN, Disable: []string{"traefik"},
	}.Render()
	if err != nil {
		t.Fatal(err)
	}
	if err := e2e.Upload(ctx, h, map[string]e2e.File{k3s.AuditPolicyPath: {Data: k3s.AuditPolicy(), Mode: 0o600}}); err != nil {
		t.Fatal(err)
	}
	if err := s.InstallStandin(ctx, h, "server", string(cfg)); err != nil {
		t.Fatal(err)
	}
	restCfg, err := kube.LoadConfig(s.Kubeconfig(ctx, t, h), "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClients(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "audited", Namespace: "default"}, StringData: map[string]string{"password": "never-in-the-log"}}
	if _, err := c.Kube.CoreV1().Secrets("default").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := c.Kube.CoreV1().Nodes().Get(ctx, h.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Annotations["flannel.alpha.coreos.com/backend-type"]; got != "vxlan" {
		t.Errorf("Node's flannel backend %q, want vxlan", got)
	}
	var log string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if log, err = h.Run(ctx, "cat "+k3s.AuditLogPath); err == nil && strings.Contains(log, `"name":"audited"`) {
			break
		}
	}
	if !strings.Contains(log, `"level":"Metadata"`) || !strings.Contains(log, `"name":"audited"`) {
		t.Fatalf("the audit log at %s lacks the Secret's create at Metadata level:\n%.2000s", k3s.AuditLogPath, log)
	}
	if strings.Contains(log, "never-in-the-log") || strings.Contains(log, `"requestObject"`) {
		t.Fatal("the audit log holds a request body")
	}
}

func nodeAddress(n *corev1.Node, kind corev1.NodeAddressType) string {
	for _, a := range n.Status.Addresses {
		if a.Type == kind {
			return a.Address
		}
	}
	return ""
}

// waitContainer waits until a container with marker in its command line runs on this machine
// (running) or none does.
func waitContainer(ctx context.Context, t *testing.T, marker string, running bool, timeout time.Duration) {
	t.Helper()
	if err := poll(ctx, timeout, fmt.Sprintf("a container %q running: %v", marker, running), func(context.Context) (bool, error) {
		return containerRunning(marker) == running, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitNodeReady waits until the Node's Ready condition has the given status.
func waitNodeReady(ctx context.Context, t *testing.T, c *kube.Clients, name string, want corev1.ConditionStatus, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last corev1.ConditionStatus
	for time.Now().Before(deadline) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					last = cond.Status
				}
			}
			if last == want {
				return
			}
		}
		time.Sleep(2 * time.Second)
	}
	t.Fatalf("Node %s Ready is %q after %s, want %q", name, last, timeout, want)
}
