package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/nodelease"
)

// node is what a stand-in process knows about the Node it keeps: its own, as a kubelet would.
type node struct {
	name        string
	hostname    string
	internalIPs []string
	externalIPs []string
	ipGiven     bool // node-ip was set: kubelet's alpha.kubernetes.io/provided-node-ip
	labels      map[string]string
	taints      []corev1.Taint
	annotations map[string]string
	kubeletPort int
	version     string
	dataDir     string
	kwok        bool // standin-kubelet kwok: kwok plays the kubelet
}

// nodeFrom reads the node settings common to server and agent.
func nodeFrom(o *options, version, dataDir string) (*node, error) {
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("read hostname: %w", err)
	}
	n := &node{hostname: strings.ToLower(host), version: version, dataDir: dataDir, kubeletPort: 10250,
		kwok: o.str("standin-kubelet") == kubeletKwok}
	n.name = o.str("node-name")
	if n.name == "" {
		n.name = n.hostname
	}
	if errs := validation.IsDNS1123Subdomain(n.name); len(errs) > 0 {
		return nil, fmt.Errorf("node name %q is not valid: %s", n.name, strings.Join(errs, "; "))
	}
	n.internalIPs, n.ipGiven = o.list("node-ip"), len(o.list("node-ip")) > 0
	if !n.ipGiven {
		// As k3s: the address of the interface holding the default route, else the first
		// global unicast address.
		ip, err := utilnet.ChooseHostInterface()
		if err != nil {
			return nil, fmt.Errorf("find the node's IP address (set node-ip): %w", err)
		}
		n.internalIPs = []string{ip.String()}
	}
	n.externalIPs = o.list("node-external-ip")
	for _, ip := range append(append([]string(nil), n.internalIPs...), n.externalIPs...) {
		if net.ParseIP(ip) == nil {
			return nil, fmt.Errorf("invalid node IP address %q", ip)
		}
	}
	n.labels = map[string]string{}
	for _, l := range o.list("node-label") {
		k, v, ok := strings.Cut(l, "=")
		if !ok || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return nil, fmt.Errorf("invalid node-label %q: want key=value", l)
		}
		n.labels[k] = v
	}
	for _, t := range o.list("node-taint") {
		taint, err := parseTaint(t)
		if err != nil {
			return nil, err
		}
		n.taints = append(n.taints, taint)
	}
	for _, a := range o.list("kubelet-arg") {
		if v, ok := strings.CutPrefix(strings.TrimPrefix(a, "--"), "port="); ok {
			if n.kubeletPort, err = strconv.Atoi(v); err != nil {
				return nil, fmt.Errorf("invalid kubelet-arg %q: %w", a, err)
			}
		}
	}
	if n.annotations, err = o.nodeConfigAnnotations(os.Environ()); err != nil {
		return nil, err
	}
	return n, nil
}

// parseTaint reads key[=value]:Effect.
func parseTaint(s string) (corev1.Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	k, v, _ := strings.Cut(kv, "=")
	t := corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		ok = false
	}
	if !ok || len(validation.IsQualifiedName(k)) > 0 {
		return corev1.Taint{}, fmt.Errorf("invalid node-taint %q: want key=value:Effect", s)
	}
	return t, nil
}

// flannelTypes are the backend types flannel records on a Node (its backend-type annotation) for
// k3s's flannel-backend settings: k3s's wireguard-native runs flannel's backend registered as
// "wireguard"; the others are flannel's own names.
var flannelTypes = map[string]string{"wireguard-native": "wireguard"}

// flannelType is the type flannel records for k3s's flannel-backend setting backend.
func flannelType(backend string) string {
	if t, ok := flannelTypes[backend]; ok {
		return t
	}
	return backend
}

// k3sBackend is the flannel-backend setting whose backend flannel records as typ.
func k3sBackend(typ string) string {
	for backend, t := range flannelTypes {
		if t == typ {
			return backend
		}
	}
	return typ
}

// setFlannel adds the annotations k3s's flannel puts on a Node; backend (the flannel-backend
// setting) "none" means no flannel.
func (n *node) setFlannel(backend string, externalIP bool) {
	if backend == "none" {
		return
	}
	public := n.internalIPs[0]
	if externalIP && len(n.externalIPs) > 0 {
		public = n.externalIPs[0]
	}
	n.annotations["flannel.alpha.coreos.com/backend-type"] = flannelType(backend)
	n.annotations["flannel.alpha.coreos.com/kube-subnet-manager"] = "true"
	n.annotations["flannel.alpha.coreos.com/public-ip"] = public
}

// agentDir holds the node's credentials, as k3s's agent directory does.
func (n *node) agentDir() string { return filepath.Join(n.dataDir, "agent") }

// object returns the Node as a kubelet running under k3s registers it, status included.
func (n *node) object() *corev1.Node {
	labels := map[string]string{
		corev1.LabelHostname:               n.name,
		corev1.LabelOSStable:               "linux",
		corev1.LabelArchStable:             runtime.GOARCH,
		"beta.kubernetes.io/os":            "linux",
		"beta.kubernetes.io/arch":          runtime.GOARCH,
		corev1.LabelInstanceTypeStable:     "k3s",
		"beta.kubernetes.io/instance-type": "k3s",
	}
	annotations := map[string]string{
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"k3s.io/hostname":    n.hostname,
		"k3s.io/internal-ip": strings.Join(n.internalIPs, ","),
	}
	if n.ipGiven {
		annotations["alpha.kubernetes.io/provided-node-ip"] = strings.Join(n.internalIPs, ",")
	}
	if len(n.externalIPs) > 0 {
		annotations["k3s.io/external-ip"] = strings.Join(n.externalIPs, ",")
	}
	for k, v := range n.annotations {
		annotations[k] = v
	}
	for k, v := range n.labels {
		labels[k] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels, Annotations: annotations},
		Spec:       corev1.NodeSpec{ProviderID: "k3s://" + n.name, Taints: n.taints},
		Status:     n.status(nil),
	}
}

// status is the Node's status as its kubelet reports it, keeping the transition times of
// conditions that did not change since old.
func (n *node) status(old *corev1.NodeStatus) corev1.NodeStatus {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(n.dataDir, &fs) == nil {
		capacity[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(fs.Blocks)*fs.Bsize, resource.BinarySI)
	}
	var addrs []corev1.NodeAddress
	for _, ip := range n.internalIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	for _, ip := range n.externalIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.hostname})
	return corev1.NodeStatus{
		Capacity:        capacity,
		Allocatable:     capacity.DeepCopy(),
		Conditions:      n.conditions(old),
		Addresses:       addrs,
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(n.kubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               readTrimmed("/etc/machine-id"),
			SystemUUID:              strings.ToLower(readTrimmed("/sys/class/dmi/id/product_uuid")),
			BootID:                  readTrimmed("/proc/sys/kernel/random/boot_id"),
			KernelVersion:           readTrimmed("/proc/sys/kernel/osrelease"),
			OSImage:                 osImage(),
			ContainerRuntimeVersion: "k3s-standin://kwok",
			KubeletVersion:          n.version,
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
}

func (n *node) conditions(old *corev1.NodeStatus) []corev1.NodeCondition {
	now := metav1.Now()
	want := []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
	}
	for i := range want {
		want[i].LastHeartbeatTime = now
		want[i].LastTransitionTime = now
		if old == nil {
			continue
		}
		for _, c := range old.Conditions {
			if c.Type == want[i].Type && c.Status == want[i].Status {
				want[i].LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	return want
}

func memTotal() int64 {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			return kib * 1024
		}
	}
	return 0
}

func readTrimmed(path string) string {
	data, _ := os.ReadFile(path)
	return strings.TrimSpace(string(data))
}

func osImage() string {
	for _, line := range strings.Split(readTrimmed("/etc/os-release"), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "Linux"
}

// register creates the Node or, when it exists (a restart), brings its labels, annotations and
// status up to date as a restarted kubelet and k3s would; node-label and node-taint apply only
// when the Node is created, as with k3s. For kwok, which plays only the Node's pods.
func (n *node) register(ctx context.Context, kube kubernetes.Interface) error {
	_, err := kube.CoreV1().Nodes().Create(ctx, n.object(), metav1.CreateOptions{})
	if err == nil {
		slog.Info("registered node " + n.name)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", n.name, err)
	}
	return n.updateNode(ctx, kube, true)
}

// update brings the labels and annotations k3s puts on a Node up to date once the kubelet has
// registered it.
func (n *node) update(ctx context.Context, kube kubernetes.Interface) error {
	return n.updateNode(ctx, kube, false)
}

// updateNode patches the labels and annotations k3s keeps (and the provider ID when unset) onto
// the Node, and with withStatus its status. A patch, not an update of the object read: the node
// lifecycle controller may change the Node's taints meanwhile (a restarted server's Node goes
// not-ready and back), and NodeRestriction refuses a node's write that carries other taints than
// the stored ones.
func (n *node) updateNode(ctx context.Context, kube kubernetes.Interface, withStatus bool) error {
	want := n.object()
	cur, err := kube.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("update node %s: %w", n.name, err)
	}
	labels := map[string]string{}
	for k, v := range want.Labels {
		if _, fromNodeLabel := n.labels[k]; !fromNodeLabel {
			labels[k] = v
		}
	}
	meta := map[string]any{"labels": labels, "annotations": want.Annotations}
	patch := map[string]any{"metadata": meta}
	if cur.Spec.ProviderID == "" {
		patch["spec"] = map[string]any{"providerID": want.Spec.ProviderID}
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		updated, err := kube.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, body, metav1.PatchOptions{})
		if err != nil || !withStatus {
			return err
		}
		updated.Status = n.status(&updated.Status)
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("update node %s: %w", n.name, err)
	}
	slog.Info("updated node " + n.name)
	return nil
}

// statusInterval is how old the Node's heartbeat may get before it is posted again.
const statusInterval = time.Minute

// heartbeat keeps the Node alive until ctx ends, as a kubelet does: it renews the Node's Lease
// and posts Ready when the heartbeat is old or the node lifecycle controller marked the Node
// otherwise. When the process stops, the Lease goes stale and the controller marks the Node
// NotReady (Unknown) after its --node-monitor-grace-period.
func (n *node) heartbeat(ctx context.Context, kube kubernetes.Interface) {
	t := time.NewTicker(nodelease.Interval)
	defer t.Stop()
	for {
		if err := nodelease.Renew(ctx, kube, n.name); err != nil && ctx.Err() == nil {
			slog.Warn("renew node lease", "node", n.name, "err", err)
		}
		if err := n.postStatus(ctx, kube); err != nil && ctx.Err() == nil {
			slog.Warn("post node status", "node", n.name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *node) postStatus(ctx context.Context, kube kubernetes.Interface) error {
	cur, err := kube.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range cur.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && time.Since(c.LastHeartbeatTime.Time) < statusInterval {
			return nil
		}
	}
	cur.Status.Conditions = n.conditions(&cur.Status)
	_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}

// writeCredentials writes the kubeconfigs of the node's client certificates (already written to
// agent/, see identities), the cluster CA and a kubelet serving certificate where k3s's agent
// keeps them.
func (n *node) writeCredentials(server string, caPEM []byte, c *nodeCreds) error {
	dir := n.agentDir()
	if err := controlplane.WriteFile(filepath.Join(dir, "server-ca.crt"), caPEM, 0o644); err != nil {
		return err
	}
	for _, id := range n.identities(c) {
		if err := writeKubeconfig(filepath.Join(dir, id.kubeconfig), 0o600, server, caPEM, *id.into); err != nil {
			return err
		}
	}
	// Self-signed, like a kubelet's without serving-certificate bootstrap.
	var ips []net.IP
	for _, ip := range append(append([]string(nil), n.internalIPs...), n.externalIPs...) {
		ips = append(ips, net.ParseIP(ip))
	}
	_, err := ensureCert(filepath.Join(dir, "serving-kubelet.crt"), filepath.Join(dir, "serving-kubelet.key"), nil,
		certSpec{cn: n.hostname, usage: x509.ExtKeyUsageServerAuth, dns: []string{n.hostname, n.name}, ips: ips})
	return err
}

// kwokStages are the kwok v0.8.0 "fast" Pod stages (tools/testenv.sh copies them next to the
// binaries): Pods go Running at once, Jobs' Pods complete, deleted Pods go.
var kwokStages = []string{"pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml"}

// kwokNodeStage matches no Node. kwok handles a Node's Pods only once its Node controller runs,
// which needs a Node stage; with this one it never changes the Node: the stand-in process keeps
// its Node Ready itself, so that the Node fails when the process stops, as with a kubelet.
const kwokNodeStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: k3s-standin-node-untouched
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: .metadata.name
      operator: DoesNotExist
  next: {}
`

// startKwok runs kwok for this Node's Pods only, with the Node's own identity, so it can do what
// a kubelet may (Node authorizer, NodeRestriction) and, through kwokGroup, list Nodes when it
// starts. It serves the kubelet endpoint's /healthz over HTTPS on the kubelet port.
func (n *node) startKwok(sup *supervisor, binDir string) error {
	stages := []string{"-"} // kwokNodeStage, on stdin
	for _, s := range kwokStages {
		stages = append(stages, filepath.Join(binDir, "kwok-stages", s))
	}
	dir := n.agentDir()
	return sup.start("kwok", filepath.Join(binDir, "kwok"), []string{
		"--kubeconfig=" + filepath.Join(dir, kwokKubeconfig),
		"--config=" + strings.Join(stages, ","),
		"--manage-single-node=" + n.name,
		"--node-lease-duration-seconds=0",
		"--node-port=" + strconv.Itoa(n.kubeletPort),
		"--tls-cert-file=" + filepath.Join(dir, "serving-kubelet.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "serving-kubelet.key"),
	}, childEnv("HOME="+dir), strings.NewReader(kwokNodeStage)) // HOME: kwok also reads ~/.kwok/kwok.yaml
}

// waitKubelet waits until kwok answers /healthz on the kubelet endpoint, so that READY=1 means
// the kubelet answers, as a kubelet's port does once k3s is up. It trusts only the endpoint's own
// self-signed certificate.
func (n *node) waitKubelet(ctx context.Context, sup *supervisor) error {
	certPEM, err := os.ReadFile(filepath.Join(n.agentDir(), "serving-kubelet.crt"))
	if err != nil {
		return fmt.Errorf("read kubelet serving certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(certPEM) {
		return errors.New("read kubelet serving certificate: no certificate")
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	url := "https://" + net.JoinHostPort(n.internalIPs[0], strconv.Itoa(n.kubeletPort)) + "/healthz"
	return waitFor(ctx, sup, "kwok's kubelet endpoint", time.Minute, func(ctx context.Context) error {
		return controlplane.HTTPOK(ctx, client, url, "ok")
	})
}

// checkFiles reports the stand-in's programs and kwok stages missing from binDir.
func checkFiles(binDir string, names ...string) error {
	var missing []string
	for _, name := range names {
		if fi, err := os.Stat(filepath.Join(binDir, name)); err != nil || fi.IsDir() {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("k3s stand-in programs missing in %s: %s (set --standin-bin-dir or KIP_STANDIN_BIN; make testenv builds them)",
			binDir, strings.Join(missing, ", "))
	}
	return nil
}

// kwokFiles are the files startKwok needs in the binaries' directory.
func kwokFiles() []string {
	files := []string{"kwok"}
	for _, s := range kwokStages {
		files = append(files, filepath.Join("kwok-stages", s))
	}
	return files
}
