//go:build kipfault

package node

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/sshd"
	"kipper.run/kip/test/testenv"
)

// The helper process: the test binary run again with these set fences a worker against the
// parent's API server, as kip node fence WORKER --powered-off --yes does, with the parent's sshd
// as the cluster's server, on which the fence checks that the worker's kubelet is gone.
const (
	fenceHelperKubeconfig = "KIP_FENCE_HELPER_KUBECONFIG"
	fenceHelperWorker     = "KIP_FENCE_HELPER_WORKER"
	fenceHelperServer     = "KIP_FENCE_HELPER_SERVER" // the sshd's host:port
	fenceHelperKey        = "KIP_FENCE_HELPER_KEY"
	fenceHelperKnownHosts = "KIP_FENCE_HELPER_KNOWN_HOSTS"
)

func init() { asHelper = faulttest.AsHelper(fenceHelperKubeconfig, helperFence) }

func helperFence(kubeconfig string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	server, portText, err := net.SplitHostPort(os.Getenv(fenceHelperServer))
	if err != nil {
		return fmt.Errorf("%s: %w", fenceHelperServer, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return fmt.Errorf("%s: %w", fenceHelperServer, err)
	}
	worker := os.Getenv(fenceHelperWorker)
	ios := &cli.IOStreams{Out: os.Stderr, ErrOut: os.Stderr, Getenv: os.Getenv}
	var dialled []*sshx.Client
	defer func() {
		for _, c := range dialled {
			c.Close()
		}
	}()
	env := Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, true),
		CommandLine: "kip node fence " + worker + " --powered-off --yes (helper)", KipVersion: "v0.0.0-test", Debugf: func(string, ...any) {},
		Dial: func(ctx context.Context, host string) (*sshx.Client, error) {
			if host != server {
				return nil, fmt.Errorf("dial tcp %s:22: connect: no route to host", host)
			}
			c, err := sshx.Dial(ctx, sshx.Config{Host: server, Port: port, User: sshd.User, KeyPath: os.Getenv(fenceHelperKey),
				KnownHostsPath: os.Getenv(fenceHelperKnownHosts), Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
			if err == nil {
				dialled = append(dialled, c)
			}
			return c, err
		}}
	return Fence(context.Background(), &FenceOptions{Worker: worker, PoweredOff: true, Env: env})
}

// fenceEnv is the cluster the fence is killed in: a Longhorn cluster's record whose server is
// the sshd on this machine, a kwok node (fenceEnvTwo) that holds the current copies of the
// services that may move and runs their pods once they do, and the console stand-in as
// console-api. Each case adds a dead worker of its own with what ran there (fenceCase).
type fenceEnv struct {
	e          *testenv.Env
	cl         *kube.Clients
	srv        *sshd.Server
	knownHosts string
}

const fenceEnvTwo = "fwx-two"

func newFenceEnv(t *testing.T) *fenceEnv {
	t.Helper()
	env, cl := apiCluster(t, "")
	f := &fenceEnv{e: env, cl: cl, srv: sshd.Start(t), knownHosts: filepath.Join(t.TempDir(), "known_hosts")}
	ctx := t.Context()
	env.AddNode(t, fenceEnvTwo, testenv.NodeOptions{})
	consoleAPI(t, cl, 0)
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().ConfigMaps(kube.RecordsNamespace).Delete(context.Background(), kube.RecordsConfigMap, metav1.DeleteOptions{})
	})
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server, rec.Backups = "small", cluster.StorageLonghorn, f.srv.Host, cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return f
}

// fenceCase is one dead worker and what ran on it: project fw<N>'s services in namespace ns, as
// in TestFence (cur with a current copy on fenceEnvTwo, stale whose copy there failed, only whose
// dump volume's only copy is on the worker, off stopped by its operator; their pods on the
// worker, adopted by the StatefulSets console-api makes), a Job whose pod there holds a
// single-node volume, and a pod of no Kipper service in namespace other with one.
type fenceCase struct {
	worker, project, ns, other string
	// ran are the UIDs of the pods the services ran on the worker.
	ran map[string]types.UID
}

// newCase sets up case n's worker, until t ends.
func (f *fenceEnv) newCase(t *testing.T, n int) fenceCase {
	t.Helper()
	ctx, cl := t.Context(), f.cl
	c := fenceCase{worker: fmt.Sprintf("fwx%d-w", n), project: fmt.Sprintf("fwx%d", n)}
	c.ns, c.other = c.project+"-prod", c.project+"-other"
	deadNode(t, cl, c.worker)
	recordWorkers(t, cl, map[string]cluster.Worker{c.worker: {Host: "192.0.2.51", State: cluster.WorkerReady,
		Path: cluster.Path{Mode: cluster.ModePrivate, Server: netip.MustParseAddr(f.srv.Host), Node: netip.MustParseAddr(fenceKubelet)}}})
	kipperProject(t, cl, c.project, "prod")
	if err := kube.Poll(ctx, time.Minute, "console-api to make namespace "+c.ns, func(ctx context.Context) (bool, string, error) {
		_, err := cl.Kube.CoreV1().Namespaces().Get(ctx, c.ns, metav1.GetOptions{})
		return err == nil, "", ignoreFound(err)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().Namespaces().Delete(context.Background(), c.other, metav1.DeleteOptions{})
	})
	for _, v := range []struct {
		ns, claim string
		copies    map[string]bool // node: current
		attached  bool            // to the worker
	}{
		{c.ns, "data-cur-0", map[string]bool{c.worker: true, fenceEnvTwo: true}, true},
		{c.ns, "data-stale-0", map[string]bool{c.worker: true, fenceEnvTwo: false}, true},
		{c.ns, "data-only-0", map[string]bool{c.worker: true, fenceEnvTwo: true}, true},
		{c.ns, "dump-only-0", map[string]bool{c.worker: true}, true},
		{c.ns, "data-off-0", map[string]bool{c.worker: true}, true},
		{c.ns, "job-data", map[string]bool{c.worker: true}, false},
		{c.other, "app-data", map[string]bool{c.worker: true}, false},
	} {
		pv := longhornClaim(t, cl, v.ns, v.claim)
		for node, current := range v.copies {
			replica(t, cl, pv+"-"+node, pv, node, current)
		}
		if v.attached {
			attach(t, cl, pv, c.worker)
		}
	}
	pod(t, cl, c.ns, "cur-0", c.worker, map[string]string{service.Label: "cur"}, "data-cur-0")
	pod(t, cl, c.ns, "stale-0", c.worker, map[string]string{service.Label: "stale"}, "data-stale-0")
	pod(t, cl, c.ns, "only-0", c.worker, map[string]string{service.Label: "only"}, "data-only-0", "dump-only-0")
	pod(t, cl, c.other, "app", c.worker, nil, "app-data")
	kipperService(t, cl, c.ns, "cur", "redis", false)
	kipperService(t, cl, c.ns, "stale", "redis", false)
	kipperService(t, cl, c.ns, "only", "postgres", false)
	kipperService(t, cl, c.ns, "off", "redis", true)
	c.ran = adopted(t, cl, c.ns, "cur", "stale", "only")
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: c.ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeName: c.worker, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "kip.invalid/job"}},
			Volumes:    []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "job-data"}}}},
		}}}}
	if _, err := cl.Kube.BatchV1().Jobs(c.ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "the Job's pod on "+c.worker, func(ctx context.Context) (bool, string, error) {
		pods, err := cl.Kube.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=nightly"})
		return err == nil && len(pods.Items) > 0, "", err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// anonymous is what with the case's names written W (the worker), NS, OTHER and P, and UIDs and
// the cluster lock's writes as faulttest.Anonymous writes them: the same for every case.
func (c fenceCase) anonymous(what string) string {
	for _, r := range [][2]string{{c.worker, "W"}, {c.ns, "NS"}, {c.other, "OTHER"}, {c.project, "P"}} {
		what = strings.ReplaceAll(what, r[0], r[1])
	}
	return faulttest.Anonymous(what, nil)
}

// fence runs the helper's fence of c's worker with env added and returns how it ended. Each run
// pauses once it is through the taint step (workflow.PauseEnv) until Kubernetes has acted on the
// taint (collected): the fence's next step then finds no Kipper pod left on the worker, as it does
// in a cluster after its minute's wait (TestFence), and the numbering of the writes does not
// depend on which of Kubernetes and kip looked first.
func (f *fenceEnv) fence(t *testing.T, c fenceCase, env ...string) faulttest.Result {
	t.Helper()
	pause := filepath.Join(t.TempDir(), "paused")
	p := faulttest.Start(t, 5*time.Minute, append([]string{fenceHelperKubeconfig + "=" + f.e.KubeconfigPath,
		fenceHelperWorker + "=" + c.worker, fenceHelperServer + "=" + f.srv.Addr(), fenceHelperKey + "=" + f.srv.ClientKeyPath,
		fenceHelperKnownHosts + "=" + f.knownHosts, fault.PollEnv + "=50ms",
		workflow.PauseEnv + "=done:taint", workflow.PauseFileEnv + "=" + pause}, env...)...)
	ended := make(chan faulttest.Result, 1)
	go func() {
		r := faulttest.Result{Exit: -1, Stderr: "waiting for the helper failed"}
		defer func() { ended <- r }()
		r = p.Wait(t)
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-ended:
			return r
		case <-tick.C:
		}
		if _, err := os.Stat(pause); err != nil {
			continue
		}
		f.collected(t, c.worker)
		if err := os.Remove(pause); err != nil {
			t.Fatal(err)
		}
	}
}

// collected waits until no pod is left on node, tainted out of service: the taint eviction
// controller deletes each pod there that does not tolerate the taint at once, and the pod garbage
// collector force-deletes a terminating pod of a NotReady node tainted out of service, marking it
// Failed first (its gcTerminating), but only every 20 s. The test does the collector's part for
// it, under the collector's own conditions, so that each fence here waits on kip rather than on
// that timer (a case took 20 s, not 5, with the collector alone); the real collector, which may
// come first, does the same. TestFence leaves it to the real one.
func (f *fenceEnv) collected(t *testing.T, node string) {
	t.Helper()
	pods := f.cl.Kube.CoreV1().Pods("")
	if err := kube.Poll(t.Context(), 2*time.Minute, "Kubernetes to delete the pods on "+node, func(ctx context.Context) (bool, string, error) {
		n, err := f.cl.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, "", err
		}
		var left []string
		for _, p := range list.Items {
			left = append(left, p.Namespace+"/"+p.Name)
			if p.DeletionTimestamp == nil || readyCondition(n) == corev1.ConditionTrue || !hasTaint(n, cluster.OutOfServiceTaint) {
				continue // not the collector's to delete
			}
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				p.Status.Phase = corev1.PodFailed
				if _, err := f.cl.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, &p, metav1.UpdateOptions{}); err != nil {
					continue // changed meanwhile, or gone: the next poll sees
				}
			}
			err := f.cl.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0),
				Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return false, "", err
			}
		}
		return len(left) == 0, strings.Join(left, ", "), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// settled waits until console-api and the controllers are through with what the fence of c
// changed: each service's status observes its generation in a phase it stays in (Running or
// Stopped), and each of its StatefulSets has as many pods, ready, as it asks for. A fence that
// ends otherwise is reported by the end state that follows.
func (f *fenceEnv) settled(t *testing.T, c fenceCase) {
	t.Helper()
	err := kube.Poll(t.Context(), 2*time.Minute, "the services of "+c.ns+" to settle", func(ctx context.Context) (bool, string, error) {
		services, err := service.List(ctx, f.cl.Dynamic, f.cl.Kube)
		if err != nil {
			return false, "", err
		}
		for _, s := range services {
			if s.Namespace() != c.ns {
				continue
			}
			if s.ObservedGeneration != s.Generation || s.Phase != service.PhaseRunning && s.Phase != service.PhaseStopped {
				return false, fmt.Sprintf("service %s: phase %s, generation %d observed %d", s.Name, s.Phase, s.Generation, s.ObservedGeneration), nil
			}
			sts, err := f.cl.Kube.AppsV1().StatefulSets(c.ns).Get(ctx, s.StatefulSet(), metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			want := ptr.Deref(sts.Spec.Replicas, 1)
			if sts.Status.ObservedGeneration != sts.Generation || sts.Status.Replicas != want || sts.Status.ReadyReplicas != want {
				return false, fmt.Sprintf("StatefulSet %s: %d of %d pods, %d ready", sts.Name, sts.Status.Replicas, want, sts.Status.ReadyReplicas), nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Error(err)
	}
}

// endState describes, with the case's names anonymous, everything the fence of c leaves once it
// settled: the worker's record and its fence (all but its time), the services (stopped, the
// fence's mark, phase), their StatefulSets, every pod of the case's namespaces (where, whether
// Ready, whose, whether the one that ran on the worker), the Job, the worker's node (cordon and
// taints, their times and the node lifecycle controller's aside), the pods on it, the
// attachments of the case's volumes, the fence's unfinished progress record and the cluster
// lock.
func (f *fenceEnv) endState(t *testing.T, c fenceCase) string {
	t.Helper()
	ctx, cl := t.Context(), f.cl
	f.settled(t, c)
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	nodes, err := cluster.ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	w := nodes.Workers[c.worker]
	add("worker record: host %s, state %s", w.Host, w.State)
	if fence := w.Fence; fence != nil {
		var stopped []string
		for _, s := range fence.Stopped {
			stopped = append(stopped, stoppedRef(s).String()+" ("+s.Why+")")
		}
		add("fence: boot %s, powered off %v, stopped [%s], suspended %v", fence.BootID, fence.PoweredOff, strings.Join(stopped, "; "), fence.Suspended)
	}
	services, err := service.List(ctx, cl.Dynamic, cl.Kube)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		if s.Namespace() == c.ns {
			add("service %s: stopped %v, fence mark %q, phase %s", s.Name, s.Stopped, s.FenceStop, s.Phase)
		}
	}
	sets, err := cl.Kube.AppsV1().StatefulSets(c.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets.Items {
		add("StatefulSet %s: generation %d, %d replicas, %d pods, %d ready", s.Name, s.Generation, ptr.Deref(s.Spec.Replicas, 1), s.Status.Replicas, s.Status.ReadyReplicas)
	}
	for _, ns := range []string{c.ns, c.other} {
		pods, err := cl.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			owner := "no owner"
			if o := metav1.GetControllerOf(&p); o != nil {
				owner = o.Kind + " " + o.Name + "'s"
			}
			which := "new"
			if slices.Contains(slices.Collect(maps.Values(c.ran)), p.UID) {
				which = "the one that ran on the worker"
			}
			add("pod %s/%s: on %s, ready %v, %s, %s, deleting %v", ns, p.Name, p.Spec.NodeName, podutils.IsPodReady(&p), owner, which, p.DeletionTimestamp != nil)
		}
	}
	job, err := cl.Kube.BatchV1().Jobs(c.ns).Get(ctx, "nightly", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	add("Job nightly: suspended %v", ptr.Deref(job.Spec.Suspend, false))
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, c.worker, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var taints []string
	for _, tn := range n.Spec.Taints {
		// The node lifecycle controller's taints for a node that is not Ready come at its own
		// pace (the NoExecute one rate-limited, a node every 10 s), whatever kip does.
		if tn.Key != corev1.TaintNodeNotReady && tn.Key != corev1.TaintNodeUnreachable {
			taints = append(taints, tn.Key+"="+tn.Value+":"+string(tn.Effect))
		}
	}
	sort.Strings(taints)
	add("node %s: cordoned %v, status %s, taints %v", n.Name, n.Spec.Unschedulable, cluster.NodeStatus(n), taints)
	left, err := cl.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.worker})
	if err != nil {
		t.Fatal(err)
	}
	add("pods on the worker: %d", len(left.Items))
	vas, err := cl.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var attachments []string
	for _, va := range vas.Items {
		if pv := ptr.Deref(va.Spec.Source.PersistentVolumeName, ""); strings.Contains(pv, c.ns) || strings.Contains(pv, c.other) {
			attachments = append(attachments, fmt.Sprintf("attachment %s: %s to %s, attached %v", va.Name, pv, va.Spec.NodeName, va.Status.Attached))
		}
	}
	sort.Strings(attachments)
	out = append(out, attachments...)
	unfinished, err := workflow.ListUnfinished(ctx, cl.Dynamic, kube.ClusterRecords())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unfinished {
		if p.Workflow == fenceWorkflow(c.worker) {
			add("unfinished record %s at step %s, %s", p.Workflow, p.Step, p.Status)
		}
	}
	lease, err := cl.Kube.CoordinationV1().Leases("kube-system").Get(ctx, kube.LockName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		add("cluster lock: never taken")
	case err != nil:
		t.Fatal(err)
	default:
		add("cluster lock: held by %q", ptr.Deref(lease.Spec.HolderIdentity, ""))
	}
	return c.anonymous(strings.Join(out, "\n"))
}

// TestFenceEveryWrite fences a worker that does not answer over SSH (kip node fence --powered-off
// --yes, in a helper process against the real API server, controller-manager and scheduler, the
// console stand-in running in this process as console-api) once uninterrupted, counting its
// writes, then, for each write in turn, a new worker with the same services on it, fenced and
// killed right after that write and fenced again to the end. Every run again must end as the
// uninterrupted fence did, object by object (endState): the fence's record, the services stopped
// and marked or started elsewhere, their StatefulSets and pods, the Job suspended, the node
// tainted with no pod left on it, the volumes' attachments, no unfinished record, the lock free.
// The worker does not answer, so the fence runs no command that changes a host: its writes are
// all API requests (the kubelet check on the server only reads).
func TestFenceEveryWrite(t *testing.T) {
	f := newFenceEnv(t)
	var reference string
	var all []string
	t.Run("uninterrupted", func(t *testing.T) {
		c := f.newCase(t, 0)
		file := filepath.Join(t.TempDir(), "writes")
		start := time.Now()
		r := f.fence(t, c, fault.WritesFileEnv+"="+file)
		if r.Signal != 0 || r.Exit != 0 {
			t.Fatalf("the uninterrupted fence: signal %v, exit %d\n%s", r.Signal, r.Exit, r.Stderr)
		}
		took := time.Since(start)
		if want := "Service cur in " + c.ns + " runs again on " + fenceEnvTwo; !strings.Contains(r.Stderr, want) {
			t.Errorf("the uninterrupted fence does not say %q:\n%s", want, r.Stderr)
		}
		reference = f.endState(t, c)
		for _, w := range faulttest.Writes(t, file) {
			all = append(all, c.anonymous(w))
		}
		t.Logf("measured: the uninterrupted fence made %d writes in %s:\n%s\nit ends as:\n%s", len(all), took.Round(time.Millisecond), strings.Join(all, "\n"), reference)
	})
	if len(all) == 0 {
		t.Fatal("no uninterrupted fence to compare with")
	}
	start := time.Now()
	for i := 1; i <= len(all); i++ {
		t.Run(fmt.Sprintf("killed after write %d", i), func(t *testing.T) {
			c := f.newCase(t, i)
			killed := faulttest.Killed(t, f.fence(t, c, faulttest.KillAfter(i)), i)
			// The numbering is the same in every run: the write killed after is the uninterrupted run's.
			if c.anonymous(killed) != all[i-1] {
				t.Fatalf("write %d of this run is %q, of the uninterrupted run %q", i, c.anonymous(killed), all[i-1])
			}
			r := f.fence(t, c)
			if r.Signal != 0 || r.Exit != 0 {
				t.Fatalf("the fence run again after a kill after write %d (%s): signal %v, exit %d\n%s", i, all[i-1], r.Signal, r.Exit, r.Stderr)
			}
			if got := f.endState(t, c); got != reference {
				t.Errorf("killed after write %d (%s), the fence run again ends as\n%s\nnot as the uninterrupted one:\n%s\nits output:\n%s", i, all[i-1], got, reference, r.Stderr)
			}
		})
	}
	t.Logf("measured: %d kill points, each a fence killed and run again, in %s", len(all), time.Since(start).Round(time.Second))
}
