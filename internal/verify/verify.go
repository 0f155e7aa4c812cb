// Package verify checks nodes from the inside: a Job pinned to each node resolves the API's
// Service name through cluster DNS and reaches its ClusterIP from that node's pod network, and
// kip reads the pod's log through the node's kubelet. kip install verifies every node; kip node
// add the node it joins, and with WithRegistry also that the cluster registry answers there.
package verify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
)

const (
	namespace = "kube-system"
	label     = "kipper.run/verify"
	// Image is k3s's own mirror of busybox, which k3s's local-path provisioner uses, so that an
	// airgapped node has it.
	Image = "rancher/mirrored-library-busybox:1.37.0"
	// script resolves the API's Service name through cluster DNS and sends plain HTTP to its
	// ClusterIP: the API server's answer to that, 400 ("an HTTP request to an HTTPS server"),
	// proves the route without TLS, which busybox's wget cannot do with k3s's ECDSA certificates
	// (and its -T option crashes Debian's static build: timeout bounds it instead). Its last line
	// says what failed, for kip's error, or that all passed.
	script = `dns=$(sed -n 's/^nameserver //p' /etc/resolv.conf | head -n 1)
if ! out=$(nslookup kubernetes.default.svc.cluster.local 2>&1); then
	echo "$out"
	echo "cluster DNS does not answer: kubernetes.default.svc.cluster.local did not resolve through $dns (is CoreDNS running? kubectl -n kube-system get pods -l k8s-app=kube-dns)"
	exit 1
fi
echo "$out"
api="$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
out=$(timeout 10 wget -O- "http://$api/" 2>&1 || true)
echo "$out"
if ! echo "$out" | grep -q 'HTTP/1\.[01] 400'; then
	echo "Service routing does not work: no answer from the API's Service at $api (is kube-proxy running on this node?)"
	exit 1
fi
if [ -n "$REGISTRY_PORT" ]; then
	registry="$HOST_IP:$REGISTRY_PORT"
	if ! out=$(timeout 10 wget -O- "http://$registry/v2/" 2>&1) && ! echo "$out" | grep -q 'HTTP/1\.[01] [0-9][0-9][0-9]'; then
		echo "$out"
		echo "the cluster registry does not answer on this node: no answer from Zot at $registry, the node port every node's containerd pulls through (is Zot running? kubectl -n zot get pods)"
		exit 1
	fi
	echo "the cluster registry answers at $registry"
fi
echo "` + passed + `"`
	passed = "the node's checks passed"
)

// Option adds a check to a verification.
type Option func(*corev1.Container)

// WithRegistry also checks that the cluster registry answers an HTTP request on the node's own
// address at port, the node port through which the node's containerd pulls the cluster's images:
// any HTTP answer (Zot's /v2/ answers 200, or 401 behind authentication) proves the path.
func WithRegistry(port int) Option {
	return func(c *corev1.Container) {
		c.Env = append(c.Env,
			corev1.EnvVar{Name: "REGISTRY_PORT", Value: strconv.Itoa(port)},
			corev1.EnvVar{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}})
	}
}

// JobName is the verification Job's name for node in run id: a DNS label (at most 63
// characters) that keeps as much of the node's name as fits, and ends in a hash of the whole
// name so that nodes whose long names share a beginning get Jobs of their own.
func JobName(id, node string) string {
	sum := sha256.Sum256([]byte(node))
	suffix := "-" + hex.EncodeToString(sum[:4])
	base := "kip-verify-" + id + "-"
	keep := strings.TrimRight(node[:min(len(node), 63-len(base)-len(suffix))], "-.")
	return base + keep + suffix
}

func job(id, node string, opts []Option) *batchv1.Job {
	labels := map[string]string{label: id, "app.kubernetes.io/managed-by": "kip"}
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: JobName(id, node), Namespace: namespace, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](2),
			TTLSecondsAfterFinished: ptr.To[int32](3600),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:      node,
					RestartPolicy: corev1.RestartPolicyNever,
					// It runs on a node kip holds off ordinary workloads while it checks it.
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "verify", Image: Image, Command: []string{"sh", "-c", script},
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534),
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
				},
			},
		},
	}
	for _, o := range opts {
		o(&j.Spec.Template.Spec.Containers[0])
	}
	return j
}

// Passed reports whether run id's verification passed on each of nodes (nil: every node). A
// failed one has not passed.
func Passed(ctx context.Context, c kubernetes.Interface, id string, nodes []string) (bool, error) {
	p, err := pending(ctx, c, id, nodes)
	if errors.As(err, new(*Error)) {
		return false, nil
	}
	return p == "" && err == nil, err
}

// Run verifies each of nodes (nil: every node) in run id: it replaces failed verifications of
// the run, starts the missing ones with opts' checks and waits for all, for at most timeout.
func Run(ctx context.Context, c kubernetes.Interface, id string, nodes []string, timeout time.Duration, opts ...Option) error {
	names, err := nodeNames(ctx, c, nodes)
	if err != nil {
		return err
	}
	if err := deleteFailed(ctx, c, id, timeout); err != nil {
		return err
	}
	for _, n := range names {
		j := job(id, n, opts)
		_, err := c.BatchV1().Jobs(j.Namespace).Create(ctx, j, metav1.CreateOptions{FieldManager: "kip"})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create verification job on %s: %w", n, err)
		}
	}
	return kube.PollPending(ctx, timeout, "the verification pods", func(ctx context.Context) (string, error) {
		return pending(ctx, c, id, names)
	})
}

// Log is what node's verification pod of run id printed, read through the node's kubelet (the
// API server proxies logs from the kubelet's port 10250): that it answers proves the server
// reaches the kubelet.
func Log(ctx context.Context, c kubernetes.Interface, id, node string) (string, error) {
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + JobName(id, node)})
	if err != nil {
		return "", fmt.Errorf("list the verification pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return "", fmt.Errorf("the verification pod on %s is gone", node)
	}
	pod := pods.Items[len(pods.Items)-1]
	logs, err := c.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("read the log of pod %s through the kubelet of %s: %w", pod.Name, node, err)
	}
	return strings.TrimSpace(string(logs)), nil
}

func nodeNames(ctx context.Context, c kubernetes.Interface, nodes []string) ([]string, error) {
	if nodes != nil {
		return nodes, nil
	}
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	return names, nil
}

// pending says which nodes' verification has not passed yet, or "" when every node's has. A
// failed verification is an *Error with the pod's last words.
func pending(ctx context.Context, c kubernetes.Interface, id string, nodes []string) (string, error) {
	names, err := nodeNames(ctx, c, nodes)
	if err != nil {
		return "", err
	}
	jobs, err := c.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{LabelSelector: label + "=" + id})
	if err != nil {
		return "", fmt.Errorf("list verification jobs: %w", err)
	}
	byNode := map[string]*batchv1.Job{}
	for i := range jobs.Items {
		byNode[jobs.Items[i].Spec.Template.Spec.NodeName] = &jobs.Items[i]
	}
	var left []string
	for _, n := range names {
		j := byNode[n]
		switch {
		case j == nil:
			left = append(left, n+" (not started)")
		case condition(j, batchv1.JobComplete):
		case condition(j, batchv1.JobFailed):
			return "", &Error{Node: n, Words: words(ctx, c, j)}
		default:
			left = append(left, n)
		}
	}
	return strings.Join(left, ", "), nil
}

// Error is a node whose verification failed, with what its pod printed.
type Error struct{ Node, Words string }

// Error says the pod's last line, which says what failed, then what it printed before.
func (e *Error) Error() string {
	lines := strings.Split(e.Words, "\n")
	msg := fmt.Sprintf("verification on node %s failed: %s", e.Node, lines[len(lines)-1])
	if len(lines) > 1 {
		msg += "\n  its pod printed:\n    " + strings.Join(lines[:len(lines)-1], "\n    ")
	}
	return msg
}

// deleteFailed deletes run id's failed verification Jobs, with their pods, and waits until they
// are gone, so that the same Jobs can run again.
func deleteFailed(ctx context.Context, c kubernetes.Interface, id string, timeout time.Duration) error {
	jobs := c.BatchV1().Jobs(namespace)
	list, err := jobs.List(ctx, metav1.ListOptions{LabelSelector: label + "=" + id})
	if err != nil {
		return fmt.Errorf("list verification jobs: %w", err)
	}
	var failed []string
	for _, j := range list.Items {
		if !condition(&j, batchv1.JobFailed) {
			continue
		}
		err := jobs.Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete failed verification job %s: %w", j.Name, err)
		}
		failed = append(failed, j.Name)
	}
	return kube.PollPending(ctx, timeout, "the failed verification jobs to go", func(ctx context.Context) (string, error) {
		var left []string
		for _, name := range failed {
			if _, err := jobs.Get(ctx, name, metav1.GetOptions{}); err == nil {
				left = append(left, name)
			} else if !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		return strings.Join(left, ", "), nil
	})
}

func condition(j *batchv1.Job, t batchv1.JobConditionType) bool {
	return slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
		return c.Type == t && c.Status == corev1.ConditionTrue
	})
}

// words returns the last lines a job's pod printed, or how it ended.
func words(ctx context.Context, c kubernetes.Interface, j *batchv1.Job) string {
	pods, err := c.CoreV1().Pods(j.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
	if err != nil || len(pods.Items) == 0 {
		return "its pod is gone; run the same kip command again to verify again"
	}
	pod := pods.Items[len(pods.Items)-1]
	tail := int64(10)
	logs, err := c.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err == nil && len(strings.TrimSpace(string(logs))) > 0 {
		return strings.TrimSpace(string(logs))
	}
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.State.Terminated; t != nil {
			return fmt.Sprintf("exit code %d (%s)", t.ExitCode, t.Reason)
		}
	}
	return "pod " + pod.Name + " is " + string(pod.Status.Phase)
}
