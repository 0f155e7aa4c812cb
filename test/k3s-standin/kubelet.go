package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kipper.run/kip/test/controlplane"
)

// A k3s node runs containerd, the kubelet and kube-proxy; with the standin-kubelet option
// "real" (the default) the stand-in runs them too, built from their Go modules by make testenv,
// with k3s's paths. With "kwok", kwok plays the kubelet and nothing runs (tests on the build
// machine, where no kubelet may run).
const (
	kubeletReal = "real"
	kubeletKwok = "kwok"

	// containerdSocket is where k3s's containerd listens.
	containerdSocket = "/run/k3s/containerd/containerd.sock"
	containerdState  = "/run/k3s/containerd"
	// kubeletRoot is the kubelet's directory, as on a k3s node.
	kubeletRoot = "/var/lib/kubelet"
	// cniBinDir is where Debian's containernetworking-plugins install the plugins (k3s ships
	// its own in data/current/bin).
	cniBinDir = "/usr/lib/cni"
	// runcPath is Debian's runc (k3s ships its own).
	runcPath = "/usr/sbin/runc"
	// clusterDNS and clusterDomain are k3s's defaults: the tenth address of the service network.
	clusterDNS    = "10.43.0.10"
	clusterDomain = "cluster.local"
	// podNetwork is k3s's cluster-cidr, for the masquerade rule.
	podNetwork = "10.42.0.0/16"
	// pauseImage is k3s's sandbox image.
	pauseImage = "docker.io/rancher/mirrored-pause:3.6"
)

// realNodeFiles are the programs a real node needs in the binaries' directory.
var realNodeFiles = []string{"containerd", "containerd-shim-runc-v2", "ctr", "kubelet", "kube-proxy"}

// nodeFiles are the files the chosen kubelet needs.
func nodeFiles(kubelet string) []string {
	if kubelet == kubeletKwok {
		return kwokFiles()
	}
	return realNodeFiles
}

// Paths under the agent directory, as k3s's.
func (n *node) etcDir() string         { return filepath.Join(n.agentDir(), "etc") }
func (n *node) cniConfDir() string     { return filepath.Join(n.etcDir(), "cni", "net.d") }
func (n *node) imagesDir() string      { return filepath.Join(n.agentDir(), "images") }
func (n *node) containerdRoot() string { return filepath.Join(n.agentDir(), "containerd") }
func (n *node) clientCAPath() string   { return filepath.Join(n.agentDir(), "client-ca.crt") }
func (n *node) certsDir() string       { return filepath.Join(n.etcDir(), "containerd", "certs.d") }

// run runs the Node's kubelet, the one o's standin-kubelet names, and returns when it answers.
// clientCA gives the CA of the API server's client certificates, which a real kubelet checks.
func (n *node) run(ctx, bg context.Context, sup *supervisor, cl nodeClients, o *options, clientCA func(context.Context) ([]byte, error), bgGo func(func())) error {
	binDir := o.str("standin-bin-dir")
	if n.kwok {
		if err := n.register(ctx, cl.kubelet); err != nil {
			return err
		}
		bgGo(func() { n.heartbeat(bg, cl.kubelet) })
		if err := n.startKwok(sup, binDir); err != nil {
			return err
		}
		return n.waitKubelet(ctx, sup)
	}
	ca, err := clientCA(ctx)
	if err != nil {
		return err
	}
	return n.runRealNode(ctx, bg, sup, cl, binDir, ca, o.list("kubelet-arg"), bgGo)
}

// checkKubelet checks the standin-kubelet option and that its programs are in binDir.
func checkKubelet(o *options, binDir string) error {
	k := o.str("standin-kubelet")
	if k != kubeletReal && k != kubeletKwok {
		return fmt.Errorf("invalid standin-kubelet %q: want %s or %s", k, kubeletReal, kubeletKwok)
	}
	return checkFiles(binDir, nodeFiles(k)...)
}

// runRealNode starts containerd, imports the airgap images, starts the kubelet, brings the Node's
// k3s labels and annotations up to date once the kubelet registered it, writes the pod network's
// CNI configuration for the Node's pod CIDR, starts kube-proxy and keeps the routes to other
// Nodes' pods until ctx ends. It returns when the kubelet answers its health check.
func (n *node) runRealNode(ctx, bg context.Context, sup *supervisor, cl nodeClients, binDir string, clientCA []byte, kubeletArgs []string, bgGo func(func())) error {
	kube := cl.kubelet
	if err := controlplane.WriteFile(n.clientCAPath(), clientCA, 0o644); err != nil {
		return err
	}
	for key, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"} {
		if err := os.WriteFile("/proc/sys/"+key, []byte(v), 0o644); err != nil {
			slog.Warn("set sysctl", "key", key, "err", err)
		}
	}
	env := childEnv("PATH=" + binDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if err := n.serveMirror(ctx, bg, n.certsDir(), bgGo); err != nil {
		return err
	}
	if err := n.startContainerd(ctx, sup, binDir, env); err != nil {
		return err
	}
	if err := n.importImages(ctx, binDir); err != nil {
		return err
	}
	cfg, err := n.writeKubeletConfig()
	if err != nil {
		return err
	}
	args := []string{
		"--config=" + cfg,
		"--kubeconfig=" + filepath.Join(n.agentDir(), kubeletKubeconfig),
		"--hostname-override=" + n.name,
		"--root-dir=" + kubeletRoot,
		"--node-ip=" + strings.Join(n.internalIPs, ","),
		"--cloud-provider=external",
	}
	if len(n.labels) > 0 {
		var ls []string
		for _, k := range slices.Sorted(maps.Keys(n.labels)) {
			ls = append(ls, k+"="+n.labels[k])
		}
		args = append(args, "--node-labels="+strings.Join(ls, ","))
	}
	if len(n.taints) > 0 {
		var ts []string
		for _, t := range n.taints {
			ts = append(ts, t.ToString())
		}
		args = append(args, "--register-with-taints="+strings.Join(ts, ","))
	}
	for _, a := range kubeletArgs {
		args = append(args, "--"+strings.TrimPrefix(a, "--"))
	}
	if err := sup.start("kubelet", filepath.Join(binDir, "kubelet"), args, env, nil); err != nil {
		return err
	}
	if err := waitFor(ctx, sup, "the kubelet's Node", 2*time.Minute, func(ctx context.Context) error {
		_, err := kube.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := n.update(ctx, kube); err != nil {
		return err
	}
	var cidr string
	if err := waitFor(ctx, sup, "the Node's pod CIDR", 2*time.Minute, func(ctx context.Context) error {
		nd, err := kube.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cidr = nd.Spec.PodCIDR; cidr == "" {
			return fmt.Errorf("node %s has no pod CIDR yet", n.name)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := n.writeCNIConfig(cidr); err != nil {
		return err
	}
	if err := n.podNetworkRules(ctx); err != nil {
		return err
	}
	proxyCfg, err := n.writeKubeProxyConfig()
	if err != nil {
		return err
	}
	if err := sup.start("kube-proxy", filepath.Join(binDir, "kube-proxy"), []string{"--config=" + proxyCfg}, env, nil); err != nil {
		return err
	}
	bgGo(func() { keepRoutes(bg, cl.controller, n.name) })
	plain := &http.Client{Timeout: 2 * time.Second}
	return waitFor(ctx, sup, "the kubelet", 2*time.Minute, func(ctx context.Context) error {
		return controlplane.HTTPOK(ctx, plain, "http://127.0.0.1:10248/healthz", "ok")
	})
}

// startContainerd writes k3s's containerd configuration (its socket, root and state, CRI with
// overlayfs snapshots, runc, the CNI directories, k3s's pause image) and starts containerd.
func (n *node) startContainerd(ctx context.Context, sup *supervisor, binDir string, env []string) error {
	config := fmt.Sprintf(`# Written by the k3s stand-in, after k3s's agent/etc/containerd/config.toml.
version = 3
root = %q
state = %q

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = %q

[plugins.'io.containerd.cri.v1.runtime']
  # The lab's machine withholds CAP_SYS_RESOURCE, so no process may lower its OOM score
  # (a pod sandbox asks for -998): keep scores at or above containerd's own, as rootless k3s does.
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = %q
  SystemdCgroup = false
`, n.containerdRoot(), containerdState, containerdSocket, pauseImage, n.certsDir(), cniBinDir, n.cniConfDir(), runcPath)
	path := filepath.Join(n.etcDir(), "containerd", "config.toml")
	if err := controlplane.WriteFile(path, []byte(config), 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(n.cniConfDir(), 0o755); err != nil {
		return err
	}
	if err := sup.start("containerd", filepath.Join(binDir, "containerd"), []string{"--config=" + path}, env, nil); err != nil {
		return err
	}
	return waitFor(ctx, sup, "containerd", time.Minute, func(ctx context.Context) error {
		return exec.CommandContext(ctx, filepath.Join(binDir, "ctr"), "--address="+containerdSocket, "version").Run()
	})
}

// importImages imports every agent/images/*.tar into containerd's k8s.io namespace, as k3s
// imports an airgap install's images when it starts.
func (n *node) importImages(ctx context.Context, binDir string) error {
	files, err := filepath.Glob(filepath.Join(n.imagesDir(), "*.tar"))
	if err != nil {
		return err
	}
	for _, f := range files {
		began := time.Now()
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "ctr"), "--address="+containerdSocket, "--namespace=k8s.io",
			"images", "import", f).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import images from %s: %w: %s", f, err, strings.TrimSpace(string(out)))
		}
		slog.Info("imported images", "file", f, "after", time.Since(began).Round(time.Millisecond))
	}
	return nil
}

// writeKubeletConfig writes the kubelet's configuration with k3s's settings: the agent's
// certificates, webhook authorization, cluster DNS, containerd's socket; cgroupfs and cgroup v1,
// which the lab's machine has.
func (n *node) writeKubeletConfig() (string, error) {
	dir := n.agentDir()
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    "0.0.0.0",
		"port":       n.kubeletPort,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true, "cacheTTL": "2m0s"},
			"x509":      map[string]any{"clientCAFile": n.clientCAPath()},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"cgroupDriver":             "cgroupfs",
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"clusterDNS":               []string{clusterDNS},
		"clusterDomain":            clusterDomain,
		"containerRuntimeEndpoint": "unix://" + containerdSocket,
		"evictionHard":             map[string]string{"imagefs.available": "5%", "nodefs.available": "5%"},
		"evictionMinimumReclaim":   map[string]string{"imagefs.available": "10%", "nodefs.available": "10%"},
		// A lab host's disk is the lab machine's, filled by what else that machine keeps (Go's
		// caches): at the kubelet's 85% it would delete images that tests imported and that no
		// registry serves here (the data mover's). The lab's kubelets never collect images.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 10248,
		"providerID":                  "k3s://" + n.name,
		"readOnlyPort":                0,
		"serializeImagePulls":         false,
		"staticPodPath":               filepath.Join(dir, "pod-manifests"),
		"tlsCertFile":                 filepath.Join(dir, "serving-kubelet.crt"),
		"tlsPrivateKeyFile":           filepath.Join(dir, "serving-kubelet.key"),
	}
	resolv, err := n.resolvConf()
	if err != nil {
		return "", err
	}
	cfg["resolvConf"] = resolv
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.etcDir(), "kubelet.conf.d", "00-k3s-defaults.conf")
	if err := os.MkdirAll(filepath.Join(dir, "pod-manifests"), 0o755); err != nil {
		return "", err
	}
	return path, controlplane.WriteFile(path, data, 0o600)
}

// resolvConf chooses the resolv.conf the kubelet gives pods with the Default DNS policy (CoreDNS
// among them) as k3s chooses it: the host's when it names a nameserver that is not on loopback,
// else systemd-resolved's upstream one, else one k3s writes, naming 8.8.8.8.
func (n *node) resolvConf() (string, error) {
	for _, p := range []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"} {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
				if ip := net.ParseIP(f[1]); ip != nil && !ip.IsLoopback() {
					return p, nil
				}
			}
		}
	}
	p := filepath.Join(n.etcDir(), "resolv.conf")
	return p, controlplane.WriteFile(p, []byte("nameserver 8.8.8.8\n"), 0o644)
}

// writeKubeProxyConfig writes kube-proxy's configuration: iptables mode, k3s's cluster CIDR,
// with kube-proxy's own credentials (system:kube-proxy, as k3s's kube-proxy). It leaves the
// connection-tracking table size alone: that belongs to the machine's kernel.
func (n *node) writeKubeProxyConfig() (string, error) {
	cfg := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": filepath.Join(n.agentDir(), kubeProxyKubeconfig)},
		"mode":               "iptables",
		"clusterCIDR":        podNetwork,
		"hostnameOverride":   n.name,
		"healthzBindAddress": "127.0.0.1:10256",
		"metricsBindAddress": "127.0.0.1:10249",
		"conntrack":          map[string]any{"maxPerCore": 0, "min": 0},
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.etcDir(), "kube-proxy.conf")
	return path, controlplane.WriteFile(path, data, 0o600)
}

// writeCNIConfig writes the pod network of the Node's pod CIDR: a bridge cni0 with the CIDR's
// first address as the pods' gateway, as flannel's CNI configuration on k3s, and portmap for
// host ports.
func (n *node) writeCNIConfig(cidr string) error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "cbr0",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true, "forceAddress": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": cidr}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return controlplane.WriteFile(filepath.Join(n.cniConfDir(), "10-standin.conflist"), data, 0o644)
}

// The pod network's iptables rules, as flannel's on k3s: STANDIN-POSTRTG (nat) gives pods'
// traffic leaving the pod network the node's address; STANDIN-FWD (filter) forwards the pod
// network's traffic whatever the FORWARD policy (ufw's is DROP), as flannel's FLANNEL-FWD.
var podNetworkChains = []struct {
	table, name, parent string
	rules               [][]string
}{
	{"nat", "STANDIN-POSTRTG", "POSTROUTING", [][]string{{"-s", podNetwork, "!", "-d", podNetwork, "-j", "MASQUERADE", "--random-fully"}}},
	{"filter", "STANDIN-FWD", "FORWARD", [][]string{{"-s", podNetwork, "-j", "ACCEPT"}, {"-d", podNetwork, "-j", "ACCEPT"}}},
}

// podNetworkRules installs podNetworkChains, replacing what an earlier start left.
func (n *node) podNetworkRules(ctx context.Context) error {
	for _, c := range podNetworkChains {
		ipt := func(args ...string) error {
			out, err := exec.CommandContext(ctx, "iptables", append([]string{"-w", "-t", c.table}, args...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("iptables -t %s %s: %w: %s", c.table, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
		if ipt("-n", "-L", c.name) != nil {
			if err := ipt("-N", c.name); err != nil {
				return err
			}
		}
		if err := ipt("-F", c.name); err != nil {
			return err
		}
		for _, r := range c.rules {
			if err := ipt(append([]string{"-A", c.name}, r...)...); err != nil {
				return err
			}
		}
		if ipt("-C", c.parent, "-j", c.name) != nil {
			if err := ipt("-A", c.parent, "-j", c.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepRoutes routes each other Node's pod CIDR through that Node's internal address, as
// flannel's host-gw backend does, until ctx ends: the lab's hosts share a network, so no
// tunnel is needed. kube lists every Node, which k3s's flannel does with k3s-controller's
// credentials.
func keepRoutes(ctx context.Context, kube kubernetes.Interface, self string) {
	routed := map[string]string{} // pod CIDR → via
	for {
		nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			want := map[string]string{}
			for _, nd := range nodes.Items {
				if nd.Name == self || nd.Spec.PodCIDR == "" {
					continue
				}
				if ip := internalIP(&nd); ip != "" {
					want[nd.Spec.PodCIDR] = ip
				}
			}
			for cidr, via := range want {
				if routed[cidr] == via {
					continue
				}
				if out, err := exec.CommandContext(ctx, "ip", "route", "replace", cidr, "via", via).CombinedOutput(); err != nil {
					slog.Warn("route pods", "cidr", cidr, "via", via, "err", err, "out", strings.TrimSpace(string(out)))
					continue
				}
				routed[cidr] = via
			}
			for cidr, via := range routed {
				if _, ok := want[cidr]; !ok {
					_ = exec.CommandContext(ctx, "ip", "route", "del", cidr, "via", via).Run()
					delete(routed, cidr)
				}
			}
		} else if ctx.Err() == nil {
			slog.Warn("list nodes for pod routes", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func internalIP(nd *corev1.Node) string {
	for _, a := range nd.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && net.ParseIP(a.Address).To4() != nil {
			return a.Address
		}
	}
	if v := nd.Annotations["k3s.io/internal-ip"]; v != "" {
		return strings.Split(v, ",")[0]
	}
	return ""
}
