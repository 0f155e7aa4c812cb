package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/test/need"
)

const (
	// KwokVersion is the kwok that tools/testenv.sh installs.
	KwokVersion = "v0.8.0"
	// KwokNodeAnnotation marks the Nodes kwok manages (value "fake").
	KwokNodeAnnotation = "kwok.x-k8s.io/node"
	// PodCIDR is where kwok allocates Pod IPs.
	PodCIDR = "10.42.0.0/16"
)

// requiredStages are the kwok stages that make fake Nodes Ready and keep them so, and move Pods
// to Running (Succeeded for Jobs) and delete them when asked: kwok's node-fast, node-heartbeat
// and pod-fast sets.
var requiredStages = []string{"node-initialize", "node-heartbeat", "pod-ready", "pod-complete", "pod-delete"}

// stageDirsInModule are where kwok's module keeps those stages.
var stageDirsInModule = []string{"node/fast", "node/heartbeat", "pod/fast"}

// StartKwok runs kwok against the environment, once per Env, managing the Nodes annotated
// kwok.x-k8s.io/node=fake (see AddNode). It runs until the environment stops.
func (e *Env) StartKwok(t testing.TB) {
	t.Helper()
	e.kwokMu.Lock()
	defer e.kwokMu.Unlock()
	if e.kwok == nil && e.kwokErr == nil {
		var note string
		e.kwok, note, e.kwokErr = e.startKwok()
		if note != "" {
			t.Logf("testenv: %s", note)
		}
	}
	var missing *missingError
	if errors.As(e.kwokErr, &missing) {
		need.Missing(t, "%s", missing.reason)
	}
	if e.kwokErr != nil {
		t.Fatalf("start kwok: %v", e.kwokErr)
	}
}

func (e *Env) startKwok() (*process, string, error) {
	if _, err := findBinaries(kwokBinary); err != nil {
		return nil, "", err
	}
	stages, note, err := kwokStages(e.binDir)
	if err != nil {
		return nil, note, err
	}
	stagesPath := filepath.Join(e.Dir, "kwok-stages.yaml")
	if err := os.WriteFile(stagesPath, stages, 0o600); err != nil {
		return nil, note, fmt.Errorf("write kwok stages: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, note, err
	}
	home := filepath.Join(e.Dir, "kwok-home") // so kwok reads no ~/.kwok/kwok.yaml
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, note, fmt.Errorf("create kwok home: %w", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	p, err := spawn(e.Dir, kwokBinary, filepath.Join(e.binDir, kwokBinary), []string{
		"--kubeconfig=" + e.KubeconfigPath,
		"--config=" + stagesPath,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
		"--node-lease-duration-seconds=0",
		"--cidr=" + PodCIDR,
		"--server-address=" + addr,
	}, []string{"HOME=" + home})
	if err != nil {
		return nil, note, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := waitHTTP(ctx, &http.Client{Timeout: 2 * time.Second}, p, "http://"+addr+"/healthz", ""); err != nil {
		_ = p.kill()
		return nil, note, fmt.Errorf("wait for kwok: %w\n%s", err, p.Tail(30))
	}
	return p, note, nil
}

// kwokStages returns the stage configuration for kwok: the stages tools/testenv.sh copied into
// bin/testenv/kwok-stages, completed from kwok's module source when some are missing.
func kwokStages(binDir string) ([]byte, string, error) {
	found := map[string][]byte{}
	files, _ := filepath.Glob(filepath.Join(binDir, "kwok-stages", "*.yaml"))
	if err := readStages(files, found); err != nil {
		return nil, "", err
	}
	var note string
	if missing := missingStages(found); len(missing) > 0 {
		cache, err := goEnv("GOMODCACHE")
		if err != nil {
			return nil, "", err
		}
		src := filepath.Join(cache, "sigs.k8s.io", "kwok@"+KwokVersion, "kustomize", "stage")
		var more []string
		for _, d := range stageDirsInModule {
			m, _ := filepath.Glob(filepath.Join(src, d, "*.yaml"))
			more = append(more, m...)
		}
		if err := readStages(more, found); err != nil {
			return nil, "", err
		}
		note = fmt.Sprintf("kwok stages %s not in %s/kwok-stages; taken from %s", strings.Join(missing, ", "), binDir, src)
		if still := missingStages(found); len(still) > 0 {
			return nil, note, &missingError{reason: fmt.Sprintf("kwok stages %s not found in %s/kwok-stages nor %s: run make testenv", strings.Join(still, ", "), binDir, src)}
		}
	}
	names := make([]string, 0, len(found))
	for name := range found {
		names = append(names, name)
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, name := range names {
		out.WriteString("---\n")
		out.Write(found[name])
		if !bytes.HasSuffix(found[name], []byte("\n")) {
			out.WriteByte('\n')
		}
	}
	return out.Bytes(), note, nil
}

func missingStages(found map[string][]byte) []string {
	var missing []string
	for _, s := range requiredStages {
		if _, ok := found[s]; !ok {
			missing = append(missing, s)
		}
	}
	return missing
}

// readStages adds the Stage documents of files to found, by name; a stage found already wins.
func readStages(files []string, found map[string][]byte) error {
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read kwok stages: %w", err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("read kwok stages %s: %w", f, err)
			}
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				return fmt.Errorf("read kwok stages %s: %w", f, err)
			}
			if head.Kind != "Stage" || head.Metadata.Name == "" {
				continue
			}
			if _, ok := found[head.Metadata.Name]; !ok {
				found[head.Metadata.Name] = doc
			}
		}
	}
	return nil
}

// FastPodAnnotations returns annotations that make kwok move a Pod through its stages without the
// waits the general stages default to (1–5 s each): put them on a Pod template when a test cares
// about what happens once Pods are Running rather than about the time they take.
func FastPodAnnotations() map[string]string {
	m := map[string]string{}
	for _, stage := range []string{"pod-create", "pod-ready", "pod-complete", "pod-delete", "pod-init-container-running", "pod-init-container-completed"} {
		m[stage+".stage.kwok.x-k8s.io/delay"] = "0s"
		m[stage+".stage.kwok.x-k8s.io/jitter-delay"] = "0s"
	}
	return m
}

// NodeOptions shape a fake Node. Empty quantities take the defaults: 4 CPUs, 8Gi memory,
// 110 Pods.
type NodeOptions struct {
	CPU    string
	Memory string
	Pods   string
	Labels map[string]string
	Taints []corev1.Taint
}

// AddNode creates a Node managed by kwok (starting kwok if needed), waits until it is Ready and
// schedulable (the node lifecycle controller has lifted its not-ready taint, which takes up to its
// 5 s monitor period) and returns it. The Node is deleted when t's cleanup runs. Nodes are cluster-wide: tests sharing an
// environment see each other's Nodes, so give them unique names and select them by label when it
// matters where a Pod lands.
func (e *Env) AddNode(t testing.TB, name string, opts NodeOptions) *corev1.Node {
	t.Helper()
	e.StartKwok(t)
	quantity := func(s, def string) resource.Quantity {
		if s == "" {
			s = def
		}
		q, err := resource.ParseQuantity(s)
		if err != nil {
			t.Fatalf("add node %s: quantity %q: %v", name, s, err)
		}
		return q
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    quantity(opts.CPU, "4"),
		corev1.ResourceMemory: quantity(opts.Memory, "8Gi"),
		corev1.ResourcePods:   quantity(opts.Pods, "110"),
	}
	labels := map[string]string{
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		"type":                   "kwok",
	}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{KwokNodeAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{Taints: opts.Taints},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("add node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.Kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete node %s: %v", name, err)
		}
	})
	// Ready, and seen Ready by the node lifecycle controller: until then the Node carries the
	// node.kubernetes.io/not-ready:NoSchedule taint, which keeps Pods (DaemonSet ones included)
	// off it.
	var state string
	for {
		n, err := e.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err != nil:
			state = err.Error()
		case !nodeReady(n):
			state = "not Ready (is kwok running? see " + filepath.Join(e.Dir, "kwok.log") + ")"
		case hasTaint(n, notReadyTaint):
			state = "Ready but still tainted " + notReadyTaint
		default:
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatalf("add node %s: after a minute: %s", name, state)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

const notReadyTaint = "node.kubernetes.io/not-ready"

func hasTaint(n *corev1.Node, key string) bool {
	for _, taint := range n.Spec.Taints {
		if taint.Key == key {
			return true
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
