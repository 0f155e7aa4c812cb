package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"kipper.run/kip/test/need"
	"kipper.run/kip/test/testenv"
)

// testVersion is the k3s version the tests build the stand-in to report: not the pin, so that
// the -X main.version path is what they see.
const testVersion = "v1.36.3+k3s1"

// standinBuild is one build of the stand-in per test binary, for one claimed release.
type standinBuild struct {
	once sync.Once
	path string
	err  error
}

var built, builtPinned standinBuild

// get builds the stand-in once into a new temporary directory, with ldflags (its claimed
// release; none for the pinned one). It builds with the test's own settings (not make
// k3s-standin's CGO_ENABLED=0 -trimpath) so that it reuses the packages compiled for the test
// and only links.
func (b *standinBuild) get(t *testing.T, ldflags ...string) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "k3s-standin-test-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "k3s")
		args := append([]string{"build", "-o", b.path}, ldflags...)
		if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatalf("build the stand-in: %v", b.err)
	}
	return b.path
}

// standinBinary is the stand-in claiming testVersion.
func standinBinary(t *testing.T) string {
	t.Helper()
	return built.get(t, "-ldflags", "-X main.version="+testVersion)
}

// pinnedStandinBinary is the stand-in claiming the pinned k3s release (manifests/versions.yaml's),
// as make k3s-standin builds it.
func pinnedStandinBinary(t *testing.T) string {
	t.Helper()
	return builtPinned.get(t)
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, p := range []string{built.path, builtPinned.path} {
		if p != "" {
			os.RemoveAll(filepath.Dir(p))
		}
	}
	os.Exit(code)
}

func TestVersionFlag(t *testing.T) {
	bin := standinBinary(t)
	want := regexp.MustCompile(`^k3s version ` + regexp.QuoteMeta(testVersion) + ` \([0-9a-z]+\)\ngo version go1\.\d+`)
	for _, flag := range []string{"--version", "-v"} {
		out, err := exec.Command(bin, flag).CombinedOutput()
		if err != nil || !want.Match(out) {
			t.Errorf("k3s %s = %q, %v; want %s", flag, out, err, want)
		}
	}
}

// testBinDir returns the test control plane's binaries, which the stand-in runs.
func testBinDir(t *testing.T) string {
	t.Helper()
	dir, err := testenv.BinDir()
	if err == nil {
		err = checkFiles(dir, append([]string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}, kwokFiles()...)...)
	}
	if err != nil {
		need.Missing(t, "%v", err)
	}
	return dir
}

// standin is a stand-in process started by a test, with its own sd_notify socket.
type standin struct {
	cmd     *exec.Cmd
	log     string
	started time.Time
	ready   chan time.Time // receives when READY=1 arrives
	done    chan struct{}
	err     error // valid after done
}

func startStandin(t *testing.T, dir, name string, args, env []string) *standin {
	t.Helper()
	return startStandinBinary(t, standinBinary(t), dir, name, args, env)
}

// startStandinBinary is startStandin with another build of the stand-in, bin.
func startStandinBinary(t *testing.T, bin, dir, name string, args, env []string) *standin {
	t.Helper()
	sock := filepath.Join(dir, name+".notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &standin{log: filepath.Join(dir, name+".log"), ready: make(chan time.Time, 1), done: make(chan struct{})}
	logFile, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	// No kubelet may run on the build machine: kwok plays it here. Lab hosts run the real one.
	s.cmd.Env = append(os.Environ(), append(env, "NOTIFY_SOCKET="+sock, "KIP_STANDIN_KUBELET="+kubeletKwok)...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s.started = time.Now()
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logFile.Close()
	go func() {
		defer conn.Close()
		buf := make([]byte, 256)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if strings.Contains(string(buf[:n]), "READY=1") {
				s.ready <- time.Now()
				return
			}
		}
	}()
	go func() {
		s.err = s.cmd.Wait()
		conn.Close()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			data, _ := os.ReadFile(s.log)
			// A child that ended it (kip's supervisor stops every child then) logged why before the
			// other children's shutdown filled the last lines: its lines and the errors first.
			var why []string
			for _, l := range strings.Split(string(data), "\n") {
				if strings.HasPrefix(l, "kwok:") || strings.Contains(l, "level=ERROR") {
					why = append(why, l)
				}
			}
			t.Logf("----- %s log: kwok's lines and errors (the first 40) -----\n%s", name, strings.Join(why[:min(len(why), 40)], "\n"))
			t.Logf("----- %s log (last 60 lines) -----\n%s", name, tail(string(data), 60))
		}
	})
	return s
}

// waitReady waits for READY=1 and returns how long it took from the process's start.
func (s *standin) waitReady(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	select {
	case at := <-s.ready:
		return at.Sub(s.started)
	case <-s.done:
		t.Fatalf("stand-in exited before READY=1: %v; see %s", s.err, s.log)
	case <-time.After(timeout):
		t.Fatalf("no READY=1 within %s; see %s", timeout, s.log)
	}
	return 0
}

// stop sends SIGTERM and waits for the exit, which must be clean.
func (s *standin) stop(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.err != nil {
			t.Errorf("stand-in exit after SIGTERM: %v, want 0; see %s", s.err, s.log)
		}
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Errorf("stand-in did not stop within 30s of SIGTERM")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// handedOut are the ports freePortRange gave this test binary's tests, which run in parallel:
// closed again, a range is free until its stand-in binds it, and another test's range must not
// take it meanwhile.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePortRange returns the first of n consecutive ports free on loopback now, below the
// kernel's ephemeral ports (a port there can be taken as a connection's source port, the
// stand-in's own apiserver talking to its etcd, between this check and the stand-in's bind; a
// kwok on the kubelet port once exited so), and none handed out before.
func freePortRange(t *testing.T, n int) int {
	t.Helper()
	low := 32768 // Linux's default first ephemeral port
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	if low-n <= 20000 {
		t.Fatalf("the ephemeral ports start at %d, leaving no room for %d ports from 20000", low, n)
	}
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 50 {
		base := 20000 + rand.IntN(low-n-20000)
		ok := true
		var ls []net.Listener
		for i := range n {
			if handedOut.ports[base+i] {
				ok = false
				break
			}
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			for i := range n {
				handedOut.ports[base+i] = true
			}
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func readyCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func nodeReady(ctx context.Context, kube kubernetes.Interface, name string) error {
	n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if c := readyCondition(n); c.Status != corev1.ConditionTrue {
		return fmt.Errorf("node %s Ready=%s (%s)", name, c.Status, c.Reason)
	}
	for _, taint := range n.Spec.Taints {
		if taint.Key == "node.kubernetes.io/not-ready" {
			return fmt.Errorf("node %s still tainted %s", name, taint.Key)
		}
	}
	return nil
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestServerAndAgent runs a server and an agent on this machine the way a lab host's units would
// (config file, environment, sd_notify), on loopback addresses and free ports: the server's API,
// files, Node and Pods; kube-apiserver-arg taking effect; an agent joining with the token and its
// Node going NotReady once it stops; each node's components' own credentials; wrong tokens
// refused; a restart keeping the PKI and deleting an earlier stand-in's bindings.
func TestServerAndAgent(t *testing.T) {
	t.Parallel() // with TestAddons
	binDir := testBinDir(t)
	standinBinary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The stand-in's own ports (KIP_STANDIN_PORT_BASE, four), then k3s's and the kubelets'.
	ports := freePortRange(t, 7)
	httpsPort, serverKubelet, agentKubelet := ports+4, ports+5, ports+6
	dataDir, kubeconfig, audit := filepath.Join(dir, "server-data"), filepath.Join(dir, "k3s.yaml"), filepath.Join(dir, "audit.log")
	writeFile(t, filepath.Join(dir, "audit-policy.yaml"), "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n")
	writeFile(t, filepath.Join(dir, "server.yaml"), fmt.Sprintf(`node-name: standin-server
node-ip: 127.0.0.1
bind-address: 127.0.0.1
https-listen-port: %d
write-kubeconfig-mode: "0644"
token: lab-secret-123
flannel-backend: wireguard-native
kubelet-arg:
  - port=%d
kube-apiserver-arg:
  - audit-log-path=%s
  - audit-policy-file=%s
protect-kernel-defaults: true
`, httpsPort, serverKubelet, audit, filepath.Join(dir, "audit-policy.yaml")))
	serverArgs := []string{"server", "--config", filepath.Join(dir, "server.yaml"), "--data-dir", dataDir, "--write-kubeconfig", kubeconfig}
	serverEnv := []string{"KIP_STANDIN_BIN=" + binDir, "KIP_STANDIN_PORT_BASE=" + strconv.Itoa(ports)}

	server := startStandin(t, dir, "server", serverArgs, serverEnv)
	startTime := server.waitReady(t, 2*time.Minute)
	t.Logf("server start (process start to READY=1): %s", startTime.Round(time.Millisecond))

	// Files where k3s writes them, with k3s's modes and formats.
	if m := fileMode(t, kubeconfig); m != 0o644 {
		t.Errorf("kubeconfig mode %o, want 644 (write-kubeconfig-mode)", m)
	}
	tokenPath := filepath.Join(dataDir, "server", "token")
	if m := fileMode(t, tokenPath); m != 0o600 {
		t.Errorf("token mode %o, want 600", m)
	}
	fullToken := strings.TrimSpace(string(readFile(t, tokenPath)))
	sum := sha256.Sum256(readFile(t, filepath.Join(dataDir, "server", "tls", "server-ca.crt")))
	if want := "K10" + hex.EncodeToString(sum[:]) + "::server:lab-secret-123"; fullToken != want {
		t.Errorf("token = %q, want %q", fullToken, want)
	}
	if nt := strings.TrimSpace(string(readFile(t, filepath.Join(dataDir, "server", "node-token")))); nt != fullToken {
		t.Errorf("node-token = %q, want the token", nt)
	}

	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(restCfg)
	if body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil || string(body) != "ok" {
		t.Fatalf("/readyz = %q, %v", body, err)
	}
	// kube-apiserver is the build of the claimed release's Kubernetes when bin/testenv has one
	// (make testenv-older), else bin/testenv's own.
	release, _ := releaseBinDir(binDir, testVersion)
	if v, err := kube.Discovery().ServerVersion(); err != nil || v.GitVersion != builtRelease(t, release) {
		t.Errorf("/version = %+v, %v; want gitVersion %s, the build in %s", v, err, builtRelease(t, release), release)
	}
	if !strings.HasPrefix(restCfg.Host, "https://127.0.0.1:") {
		t.Errorf("kubeconfig server %s, want https://127.0.0.1:<port>", restCfg.Host)
	}

	// The server's Node, as k3s registers it.
	eventually(t, time.Minute, "server node Ready", func() error { return nodeReady(ctx, kube, "standin-server") })
	n, err := kube.CoreV1().Nodes().Get(ctx, "standin-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"node-role.kubernetes.io/control-plane": "true", "node-role.kubernetes.io/master": "true", "kubernetes.io/hostname": "standin-server", "node.kubernetes.io/instance-type": "k3s"} {
		if n.Labels[k] != v {
			t.Errorf("server node label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Status.NodeInfo.KubeletVersion != testVersion {
		t.Errorf("kubeletVersion %q, want %q", n.Status.NodeInfo.KubeletVersion, testVersion)
	}
	if b := n.Annotations["flannel.alpha.coreos.com/backend-type"]; b != "wireguard" {
		t.Errorf("flannel backend annotation %q, want wireguard (flannel's backend for wireguard-native)", b)
	}
	if a := n.Annotations["k3s.io/node-args"]; !strings.Contains(a, `"--token","********"`) || strings.Contains(a, "lab-secret") || !strings.Contains(a, `"--flannel-backend","wireguard-native"`) {
		t.Errorf("k3s.io/node-args = %s", a)
	}
	if ip := n.Status.Addresses[0]; ip.Type != corev1.NodeInternalIP || ip.Address != "127.0.0.1" {
		t.Errorf("first address %v, want InternalIP 127.0.0.1", ip)
	}

	// A Deployment's Pods are scheduled and run (kwok).
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
			},
		},
	}
	if _, err := kube.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "deployment's pods Running", func() error {
		pods, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && strings.HasPrefix(p.Status.PodIP, "10.42.") {
				running++
			}
		}
		if running != 2 {
			return fmt.Errorf("%d of %d pods Running with a pod IP", running, len(pods.Items))
		}
		return nil
	})

	// kube-apiserver-arg reached kube-apiserver: its audit log has entries.
	eventually(t, 30*time.Second, "audit log entries", func() error {
		data, err := os.ReadFile(audit)
		if err != nil || !bytes.Contains(data, []byte(`"kind":"Event"`)) {
			return fmt.Errorf("audit log %s: %v, %d bytes", audit, err, len(data))
		}
		return nil
	})

	// k3s kubectl runs the bundled kubectl.
	kc := exec.Command(standinBinary(t), "kubectl", "get", "nodes", "-o", "name")
	kc.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "KIP_STANDIN_BIN="+binDir)
	if out, err := kc.CombinedOutput(); err != nil || !strings.Contains(string(out), "node/standin-server") {
		t.Errorf("k3s kubectl get nodes = %q, %v", out, err)
	}

	// An agent joins with the token from the environment, as the install script's env file gives it.
	agentDir := filepath.Join(dir, "agent-data")
	writeFile(t, filepath.Join(dir, "agent.yaml"), fmt.Sprintf("node-name: standin-agent\nnode-ip: 127.0.0.2\nkubelet-arg: [port=%d]\n", agentKubelet))
	serverURL := fmt.Sprintf("https://127.0.0.1:%d", httpsPort)
	agentArgs := []string{"agent", "--config", filepath.Join(dir, "agent.yaml"), "--data-dir", agentDir}
	agent := startStandin(t, dir, "agent", agentArgs, []string{"KIP_STANDIN_BIN=" + binDir, "K3S_URL=" + serverURL, "K3S_TOKEN=" + fullToken})
	t.Logf("agent start (process start to READY=1): %s", agent.waitReady(t, time.Minute).Round(time.Millisecond))
	eventually(t, time.Minute, "agent node Ready", func() error { return nodeReady(ctx, kube, "standin-agent") })
	an, err := kube.CoreV1().Nodes().Get(ctx, "standin-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := an.Labels["node-role.kubernetes.io/control-plane"]; ok {
		t.Error("agent node has the control-plane label")
	}
	if b := an.Annotations["flannel.alpha.coreos.com/backend-type"]; b != "wireguard" {
		t.Errorf("agent flannel backend %q, want the server's wireguard", b)
	}
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // kubelet's self-signed certificate
	resp, err := insecure.Get(fmt.Sprintf("https://127.0.0.2:%d/healthz", agentKubelet))
	if err != nil {
		t.Errorf("agent kubelet endpoint: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" {
			t.Errorf("agent kubelet endpoint /healthz = %q", body)
		}
	}

	// Each node's components have credentials of their own, as on k3s: the kubelet's are refused
	// every Node (the Node authorizer lets a kubelet read its own only), k3s-controller's may list
	// them, and kube-proxy's are system:kube-proxy, which Kubernetes' own binding lets watch
	// Services' endpoints. The server issues its Node's; the agent requested its own.
	for name, dir := range map[string]string{"standin-server": dataDir, "standin-agent": agentDir} {
		client := func(kubeconfig string) kubernetes.Interface {
			path := filepath.Join(dir, "agent", kubeconfig)
			if m := fileMode(t, path); m != 0o600 {
				t.Errorf("%s mode %o, want 600", path, m)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", path)
			if err != nil {
				t.Fatal(err)
			}
			return kubernetes.NewForConfigOrDie(cfg)
		}
		for kubeconfig, want := range map[string]string{"kubelet.kubeconfig": "system:node:" + name, "kubeproxy.kubeconfig": "system:kube-proxy", "k3scontroller.kubeconfig": "system:k3s-controller"} {
			r, err := client(kubeconfig).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil || r.Status.UserInfo.Username != want {
				t.Errorf("%s's %s: user %+v, %v; want %s", name, kubeconfig, r, err, want)
			}
		}
		kubelet := client("kubelet.kubeconfig")
		if _, err := kubelet.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s's kubelet credentials reading its Node: %v", name, err)
		}
		if _, err := kubelet.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s's kubelet credentials listing Nodes: %v, want Forbidden", name, err)
		}
		if nodes, err := client("k3scontroller.kubeconfig").CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(nodes.Items) != 2 {
			t.Errorf("%s's k3s-controller credentials listing Nodes: %v, want both Nodes", name, err)
		}
		if _, err := client("kubeproxy.kubeconfig").DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("%s's kube-proxy credentials listing EndpointSlices: %v", name, err)
		}
	}

	// Wrong tokens are refused, and the agent exits non-zero.
	wrongHash := "K10" + strings.Repeat("0", 64) + "::server:lab-secret-123"
	for token, want := range map[string]string{
		"K10" + hex.EncodeToString(sum[:]) + "::server:wrong": "refused the token",
		wrongHash: "token CA hash does not match",
	} {
		cmd := exec.CommandContext(ctx, standinBinary(t), "agent", "--server", serverURL, "--token", token, "--data-dir", filepath.Join(dir, "refused"),
			"--config", filepath.Join(dir, "agent.yaml"))
		cmd.Env = append(os.Environ(), "KIP_STANDIN_BIN="+binDir)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("agent with token %s: %v, output:\n%s\nwant a failure saying %q", token, err, out, want)
		}
	}

	// What an earlier stand-in bound to every Node, which a server upgraded in place must delete.
	legacy := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "k3s-standin-node-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, role := range map[string]string{"k3s-standin-node-reader": legacy.Name, "k3s-standin-node-proxier": "system:node-proxier"} {
		if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Stopping the agent: the Node goes NotReady when its Lease runs out. Meanwhile the server
	// restarts and must reuse its PKI.
	agent.stop(t)
	agentStopped := time.Now()
	tlsDir := filepath.Join(dataDir, "server", "tls")
	caBefore, adminBefore, kubeconfigBefore := readFile(t, filepath.Join(tlsDir, "server-ca.crt")), readFile(t, filepath.Join(tlsDir, "client-admin.crt")), readFile(t, kubeconfig)
	server.stop(t)
	server = startStandin(t, dir, "server-restarted", serverArgs, serverEnv)
	t.Logf("server restart (process start to READY=1): %s", server.waitReady(t, 2*time.Minute).Round(time.Millisecond))
	if !bytes.Equal(caBefore, readFile(t, filepath.Join(tlsDir, "server-ca.crt"))) || !bytes.Equal(adminBefore, readFile(t, filepath.Join(tlsDir, "client-admin.crt"))) {
		t.Error("the restart replaced the server CA or the admin certificate")
	}
	if !bytes.Equal(kubeconfigBefore, readFile(t, kubeconfig)) {
		t.Error("the restart changed k3s.yaml")
	}
	// The client built from the old kubeconfig keeps working.
	if _, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("old kubeconfig after restart: %v", err)
	}
	if _, err := kube.RbacV1().ClusterRoles().Get(ctx, legacy.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("cluster role %s after restart: %v, want NotFound", legacy.Name, err)
	}
	for _, name := range []string{"k3s-standin-node-reader", "k3s-standin-node-proxier"} {
		if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("cluster role binding %s after restart: %v, want NotFound", name, err)
		}
	}
	eventually(t, time.Minute, "server node Ready after restart", func() error { return nodeReady(ctx, kube, "standin-server") })

	eventually(t, 90*time.Second, "stopped agent's node NotReady", func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, "standin-agent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := readyCondition(n); c.Status == corev1.ConditionTrue {
			return fmt.Errorf("still Ready")
		}
		return nil
	})
	t.Logf("agent node NotReady %s after the agent stopped (the server restarted meanwhile)", time.Since(agentStopped).Round(time.Second))
}
