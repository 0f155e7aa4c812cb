package install

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// Timeouts of the cluster steps.
const (
	nodeReadyTimeout = 5 * time.Minute
	componentTimeout = 10 * time.Minute
	verifyTimeout    = 5 * time.Minute
	pollInterval     = 500 * time.Millisecond
)

// clusterIntent is what the cluster workflow decided, kept in its progress record so that a
// resumed run verifies with the same run ID.
type clusterIntent struct {
	VerifyID string `json:"verifyID"`
}

// runHost runs the host workflow: it keeps no record (there may be no cluster yet) and resumes
// by its checks alone.
func (in *installer) runHost(ctx context.Context) error {
	steps, err := in.hostSteps()
	if err != nil {
		return err
	}
	r := &workflow.Runner{Report: in.p, KipVersion: buildinfo.Version, DryRun: in.o.DryRun, Held: in.lock}
	return r.Run(ctx, &workflow.Workflow{Name: "install-host", Steps: steps})
}

// runCluster runs the cluster workflow under the cluster lock, recording its progress.
func (in *installer) runCluster(ctx context.Context) error {
	steps, intent, err := in.clusterSteps(ctx)
	if err != nil {
		return err
	}
	r := &workflow.Runner{
		Dynamic: in.clients.Dynamic, Lock: workflow.ClusterLock(in.clients.Kube, kube.LockOptions{}), Held: in.lock,
		Holder: kube.HolderText(in.env.CommandLine), KipVersion: buildinfo.Version, Report: in.p,
	}
	if err := r.Run(ctx, &workflow.Workflow{Name: "install", Intent: intent, Steps: steps}); err != nil {
		return fmt.Errorf("install on %s: %w", in.o.Host, err)
	}
	return nil
}

// plan is a dry run: the host steps say what they would change, and so do the cluster steps
// when the cluster exists; on a fresh host they are listed as they would run.
func (in *installer) plan(ctx context.Context) error {
	steps, err := in.hostSteps()
	if err != nil {
		return err
	}
	cs, _, err := in.clusterSteps(ctx)
	if err != nil {
		return err
	}
	if in.clients == nil {
		// No cluster yet: every cluster step would run, as it is titled.
		for i := range cs {
			cs[i].Check, cs[i].Plan = func(context.Context) (bool, error) { return false, nil }, nil
		}
	}
	steps = append(steps, cs...)
	r := &workflow.Runner{Report: in.p, DryRun: true}
	if in.clients != nil {
		r.Dynamic = in.clients.Dynamic
	}
	return r.Run(ctx, &workflow.Workflow{Name: "install", Steps: steps})
}

// componentOptions renders the components for this cluster, with what settle decided.
func (in *installer) componentOptions(ctx context.Context) (components.Options, error) {
	mon := cluster.Monitoring{Prometheus: in.sizing.Profile.Monitoring, Loki: in.sizing.Profile.Monitoring}
	if in.rerun {
		mon = in.record.Monitoring
	}
	o := components.Options{
		Sizing: in.sizing, Monitoring: mon, AdminEmail: in.adminEmail, ServerAddress: in.address,
		Backups: in.backups, Pinned: in.pinned, KipVersion: buildinfo.Version,
	}
	if in.clients != nil {
		dex, err := components.ReadDexConfig(ctx, in.clients)
		if err != nil {
			return o, err
		}
		o.ExistingDexConfig = dex
	}
	return o, nil
}

// clusterSteps are the steps on the cluster: the server's node Ready, each component, the
// cluster record, and the verification pods.
func (in *installer) clusterSteps(ctx context.Context) ([]workflow.Step, *clusterIntent, error) {
	o, err := in.componentOptions(ctx)
	if err != nil {
		return nil, nil, err
	}
	comps, err := components.Render(o)
	if err != nil {
		return nil, nil, err
	}
	intent := &clusterIntent{VerifyID: rand.String(5)}
	steps := []workflow.Step{{
		Name: "node-ready", Title: "Wait for the server's node to be Ready",
		Done: "The server's node is Ready", Already: "The server's node is Ready",
		Check: func(ctx context.Context) (bool, error) {
			pending, err := in.serverNodePending(ctx)
			return pending == "", err
		},
		Apply: func(ctx context.Context) error {
			return kube.PollPending(ctx, nodeReadyTimeout, "the server's node to be Ready", in.serverNodePending)
		},
	}}
	for _, c := range comps {
		steps = append(steps, components.Step(in.clients, c))
	}
	rec := in.intendedRecord(o, comps)
	steps = append(steps, workflow.Step{
		Name: "cluster-record", Title: "Record the cluster",
		Done: "Recorded the cluster (" + kube.RecordPrefix + cluster.RecordName + ")", Already: "The cluster's record is up to date",
		Check: func(ctx context.Context) (bool, error) {
			have, found, err := cluster.ReadRecord(ctx, in.clients.Dynamic)
			return found && have.Same(rec), err
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateRecord(ctx, in.clients.Dynamic, func(r *cluster.Record, found bool) error {
				installed := r.InstalledAt
				*r = rec
				if found && !installed.IsZero() {
					r.InstalledAt = installed
				}
				return nil
			})
			return err
		},
	}, in.verifyStep(intent), in.finishStep())
	return steps, intent, nil
}

// intendedRecord is the cluster record this run writes.
func (in *installer) intendedRecord(o components.Options, comps []components.Component) cluster.Record {
	versions := map[string]string{}
	for _, c := range in.pinned.Components {
		versions[c.Name] = c.Version
	}
	versions["k3s"] = in.move.To
	for _, c := range comps {
		if c.Version != "" {
			versions[c.Name] = c.Version
		}
	}
	backups, location := components.BackupsOf(o)
	return cluster.Record{
		Profile: in.sizing.Profile.Name, Storage: in.sizing.Storage, Network: in.network, Server: in.address,
		KipVersion: buildinfo.Version, Versions: versions, Monitoring: o.Monitoring,
		Backups: backups, BackupLocation: location, AdminEmail: o.AdminEmail,
		InstalledAt: time.Now().UTC(),
	}
}

// serverNodePending says why the server's node (the one with the server's address) is not
// Ready yet, or "" when it is.
func (in *installer) serverNodePending(ctx context.Context) (string, error) {
	nodes, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if !slices.ContainsFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Address == in.nodeIP }) {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return "", nil
			}
		}
		return "node " + n.Name + " is not Ready", nil
	}
	return "no node with address " + in.nodeIP + " has registered", nil
}

// verifyStep runs a verification Job on every node: cluster DNS resolves and a ClusterIP
// (the API's Service) answers from that node's pod network. A verification that failed (in an
// earlier run of the same install) is not done: it runs again, the failed Job replaced.
func (in *installer) verifyStep(intent *clusterIntent) workflow.Step {
	return workflow.Step{
		Name: "verify-nodes", Title: "Verify DNS and Service routing from every node",
		Done: "DNS and Service routing work on every node", Already: "Every node already verified",
		Check: func(ctx context.Context) (bool, error) {
			pending, err := in.verifyPending(ctx, intent.VerifyID)
			if errors.As(err, new(*verificationError)) {
				return false, nil
			}
			return pending == "", err
		},
		Apply: func(ctx context.Context) error {
			nodes, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return fmt.Errorf("list nodes: %w", err)
			}
			if err := in.deleteFailedVerifications(ctx, intent.VerifyID); err != nil {
				return err
			}
			for _, n := range nodes.Items {
				job := verifyJob(intent.VerifyID, n.Name)
				_, err := in.clients.Kube.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{FieldManager: "kip"})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					return fmt.Errorf("create verification job on %s: %w", n.Name, err)
				}
			}
			return kube.PollPending(ctx, verifyTimeout, "the verification pods", func(ctx context.Context) (string, error) {
				return in.verifyPending(ctx, intent.VerifyID)
			})
		},
	}
}

const (
	verifyNamespace = "kube-system"
	verifyLabel     = "kipper.run/verify"
	// verifyImage is k3s's own mirror of busybox, which k3s's local-path provisioner uses, so
	// that an airgapped server has it.
	verifyImage = "rancher/mirrored-library-busybox:1.37.0"
	// verifyScript resolves the API's Service name through cluster DNS and sends plain HTTP to
	// its ClusterIP: the API server's answer to that, 400 ("an HTTP request to an HTTPS
	// server"), proves the route without TLS, which busybox's wget cannot do with k3s's ECDSA
	// certificates (and its -T option crashes Debian's static build: timeout bounds it instead).
	// Its last line says what failed, for kip's error.
	verifyScript = `dns=$(sed -n 's/^nameserver //p' /etc/resolv.conf | head -n 1)
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
echo "cluster DNS and Service routing work"`
)

// verifyJobName is the verification Job's name for node in run id: a DNS label (at most 63
// characters) that keeps as much of the node's name as fits, and ends in a hash of the whole
// name so that nodes whose long names share a beginning get Jobs of their own.
func verifyJobName(id, node string) string {
	sum := sha256.Sum256([]byte(node))
	suffix := "-" + hex.EncodeToString(sum[:4])
	base := "kip-verify-" + id + "-"
	keep := strings.TrimRight(node[:min(len(node), 63-len(base)-len(suffix))], "-.")
	return base + keep + suffix
}

func verifyJob(id, node string) *batchv1.Job {
	name := verifyJobName(id, node)
	labels := map[string]string{verifyLabel: id, "app.kubernetes.io/managed-by": "kip"}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: verifyNamespace, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To[int32](2),
			TTLSecondsAfterFinished: ptr.To[int32](3600),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:      node,
					RestartPolicy: corev1.RestartPolicyNever,
					Tolerations:   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "verify", Image: verifyImage, Command: []string{"sh", "-c", verifyScript},
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
}

// verifyPending says which nodes' verification has not passed yet, or "" when every node's has.
// A failed verification is an error with the pod's last words.
func (in *installer) verifyPending(ctx context.Context, id string) (string, error) {
	nodes, err := in.clients.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes: %w", err)
	}
	jobs, err := in.clients.Kube.BatchV1().Jobs(verifyNamespace).List(ctx, metav1.ListOptions{LabelSelector: verifyLabel + "=" + id})
	if err != nil {
		return "", fmt.Errorf("list verification jobs: %w", err)
	}
	byNode := map[string]*batchv1.Job{}
	for i := range jobs.Items {
		byNode[jobs.Items[i].Spec.Template.Spec.NodeName] = &jobs.Items[i]
	}
	var pending []string
	for _, n := range nodes.Items {
		j := byNode[n.Name]
		switch {
		case j == nil:
			pending = append(pending, n.Name+" (not started)")
		case jobCondition(j, batchv1.JobComplete):
		case jobCondition(j, batchv1.JobFailed):
			return "", &verificationError{node: n.Name, words: in.podWords(ctx, j)}
		default:
			pending = append(pending, n.Name)
		}
	}
	return strings.Join(pending, ", "), nil
}

// verificationError is a node whose verification failed, with what its pod printed.
type verificationError struct{ node, words string }

// Error says the pod's last line, which says what failed, then what it printed before.
func (e *verificationError) Error() string {
	lines := strings.Split(e.words, "\n")
	msg := fmt.Sprintf("verification on node %s failed: %s", e.node, lines[len(lines)-1])
	if len(lines) > 1 {
		msg += "\n  its pod printed:\n    " + strings.Join(lines[:len(lines)-1], "\n    ")
	}
	return msg
}

// deleteFailedVerifications deletes run id's failed verification Jobs, with their pods, and
// waits until they are gone, so that the same Jobs can run again.
func (in *installer) deleteFailedVerifications(ctx context.Context, id string) error {
	jobs := in.clients.Kube.BatchV1().Jobs(verifyNamespace)
	list, err := jobs.List(ctx, metav1.ListOptions{LabelSelector: verifyLabel + "=" + id})
	if err != nil {
		return fmt.Errorf("list verification jobs: %w", err)
	}
	var failed []string
	for _, j := range list.Items {
		if !jobCondition(&j, batchv1.JobFailed) {
			continue
		}
		err := jobs.Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete failed verification job %s: %w", j.Name, err)
		}
		failed = append(failed, j.Name)
	}
	return kube.PollPending(ctx, verifyTimeout, "the failed verification jobs to go", func(ctx context.Context) (string, error) {
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

func jobCondition(j *batchv1.Job, t batchv1.JobConditionType) bool {
	return slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
		return c.Type == t && c.Status == corev1.ConditionTrue
	})
}

// podWords returns the last lines a job's pod printed, or how it ended.
func (in *installer) podWords(ctx context.Context, j *batchv1.Job) string {
	pods, err := in.clients.Kube.CoreV1().Pods(j.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
	if err != nil || len(pods.Items) == 0 {
		return "its pod is gone; run kip install again to verify again"
	}
	pod := pods.Items[len(pods.Items)-1]
	tail := int64(10)
	logs, err := in.clients.Kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
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
