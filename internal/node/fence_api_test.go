package node

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	consolestandin "kipper.run/kip/test/console-standin"
	"kipper.run/kip/test/sshd"
	"kipper.run/kip/test/testenv"
)

// fenceKubelet is the fenced worker's recorded address in TestFence: the test listens on its
// kubelet port to play a kubelet that still answers.
const fenceKubelet = "127.0.0.37"

// TestFence fences a worker that does not answer over SSH against the real API server,
// controller-manager and scheduler, with a real sshd on this machine as the server the kubelet
// check runs on and the console stand-in as console-api, slow (a second's delay). The worker is a
// Node the test writes NotReady for two minutes (kwok no longer manages it), with the pods the
// services ran there when it stopped reporting (the StatefulSets console-api makes adopt them);
// its Longhorn replicas and volume attachments are objects the test writes, as no Longhorn runs
// here. The service that may start elsewhere runs again only because the fence's taint had
// Kubernetes delete its pod on the worker: its StatefulSet's controller makes a new one, the
// scheduler binds it to a kwok node, and kwok runs it.
//
// Refused first: without --powered-off off a terminal; with the "kubelet" (a listener) still
// answering the server at the worker's recorded address; with the server unreachable, so that
// the check cannot run. Then the fence, with console-api down while the fence marks the services
// it stops (it waits, the worker untainted, until console-api is back and has scaled them to
// zero): recorded with the node's boot, the service with a current copy elsewhere left to start
// there and reported running where its new pod runs, the one whose other copy may be older and
// the one whose dump volume's only copy is on the worker stopped and marked (no pod of theirs
// left anywhere), a service the operator had stopped left alone, the Job with a single-node
// volume there suspended, a non-Kipper pod warned about, the node tainted out of service, and no
// Kipper pod left on it. Run again, it finds everything done. Then kip service start refuses the
// service whose only copy is on the worker and starts the stale one with --accept-stale-data,
// which console-api runs on another node.
func TestFence(t *testing.T) {
	env, cl := apiCluster(t, "fx-srv")
	srv := sshd.Start(t)
	ctx := t.Context()
	env.AddNode(t, "fx-two", testenv.NodeOptions{})
	w := deadNode(t, cl, "fx-w")
	console := consoleAPI(t, cl, time.Second)

	// The records (the cluster's, the workers', the fence's progress) go with the test: the
	// other tests of the package start without them.
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().ConfigMaps(kube.RecordsNamespace).Delete(context.Background(), kube.RecordsConfigMap, metav1.DeleteOptions{})
	})
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server, rec.Backups = "small", cluster.StorageLonghorn, srv.Host, cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.UpdateNodes(ctx, cl.Dynamic, func(n *cluster.Nodes) error {
		n.Workers["fx-w"] = cluster.Worker{Host: "192.0.2.51", State: cluster.WorkerReady,
			Path: cluster.Path{Mode: cluster.ModePrivate, Server: netip.MustParseAddr(srv.Host), Node: netip.MustParseAddr(fenceKubelet)}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fx-prod", Labels: map[string]string{service.ProjectLabel: "fx"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fx-other"}},
	} {
		if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if ns.Name != longhorn.Namespace {
			t.Cleanup(func() {
				_ = cl.Kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
			})
		}
	}

	// The services and their volumes. cur's copy on fx-two is current; stale's other copy
	// failed; only's data has a current copy elsewhere but its dump volume's only copy is on
	// fx-w; off was stopped by its operator.
	vols := []struct {
		ns, claim string
		copies    map[string]bool // node: current
		attached  bool            // to fx-w
	}{
		{"fx-prod", "data-cur-0", map[string]bool{"fx-w": true, "fx-two": true}, true},
		{"fx-prod", "data-stale-0", map[string]bool{"fx-w": true, "fx-srv": false}, true},
		{"fx-prod", "data-only-0", map[string]bool{"fx-w": true, "fx-srv": true}, true},
		{"fx-prod", "dump-only-0", map[string]bool{"fx-w": true}, true},
		{"fx-prod", "data-off-0", map[string]bool{"fx-w": true}, true},
		{"fx-prod", "job-data", map[string]bool{"fx-w": true}, false},
		{"fx-other", "app-data", map[string]bool{"fx-w": true}, false},
	}
	for _, v := range vols {
		pv := longhornClaim(t, cl, v.ns, v.claim)
		for node, current := range v.copies {
			replica(t, cl, pv+"-"+node, pv, node, current)
		}
		if v.attached {
			attach(t, cl, pv, "fx-w")
		}
	}
	// The services' pods as they ran on fx-w when it stopped reporting, made before their
	// Services: the StatefulSets console-api makes for the Services adopt them, and while they
	// are there none starts elsewhere.
	pod(t, cl, "fx-prod", "cur-0", "fx-w", map[string]string{service.Label: "cur"}, "data-cur-0")
	pod(t, cl, "fx-prod", "stale-0", "fx-w", map[string]string{service.Label: "stale"}, "data-stale-0")
	pod(t, cl, "fx-prod", "only-0", "fx-w", map[string]string{service.Label: "only"}, "data-only-0", "dump-only-0")
	kipperProject(t, cl, "fx", "prod")
	kipperService(t, cl, "fx-prod", "cur", "redis", false)
	kipperService(t, cl, "fx-prod", "stale", "redis", false)
	kipperService(t, cl, "fx-prod", "only", "postgres", false)
	kipperService(t, cl, "fx-prod", "off", "redis", true)
	oldCur := adopted(t, cl, "fx-prod", "cur", "stale", "only")["cur"]
	// A pod on fx-w that no Kipper service owns, and a Job's pod there.
	pod(t, cl, "fx-other", "app", "fx-w", nil, "app-data")
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "fx-prod"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeName: "fx-w", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "kip.invalid/job"}},
			Volumes:    []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "job-data"}}}},
		}}}}
	if _, err := cl.Kube.BatchV1().Jobs("fx-prod").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "the Job's pod on fx-w", func(ctx context.Context) (bool, string, error) {
		pods, err := cl.Kube.CoreV1().Pods("fx-prod").List(ctx, metav1.ListOptions{LabelSelector: "job-name=nightly"})
		return err == nil && len(pods.Items) > 0, "", err
	}); err != nil {
		t.Fatal(err)
	}

	out := &bytes.Buffer{}
	ios := &cli.IOStreams{Out: out, ErrOut: out, Getenv: func(string) string { return "" }}
	knownHosts := t.TempDir() + "/known_hosts"
	var dialled []*sshx.Client
	t.Cleanup(func() {
		for _, c := range dialled {
			c.Close()
		}
	})
	serverUp := true
	env2 := Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, true),
		CommandLine: "kip node fence fx-w", KipVersion: "test", Debugf: func(string, ...any) {},
		Dial: func(ctx context.Context, host string) (*sshx.Client, error) {
			if host != srv.Host || !serverUp {
				return nil, fmt.Errorf("dial tcp %s:22: connect: no route to host", host)
			}
			c, err := sshx.Dial(ctx, sshx.Config{Host: srv.Host, Port: srv.Port, User: sshd.User, KeyPath: srv.ClientKeyPath,
				KnownHostsPath: knownHosts, Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
			if err == nil {
				dialled = append(dialled, c)
			}
			return c, err
		}}
	fenceWith := func(o FenceOptions) error {
		o.Worker, o.Env = "fx-w", env2
		out.Reset()
		return Fence(ctx, &o)
	}

	// What runs on fx-w with a single-node volume, before the fence.
	on, err := onWorker(ctx, cl, "fx-w")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range on.services {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"cur", "only", "stale"}) || !slices.Equal(on.jobs, []string{"fx-prod/nightly"}) || !slices.Equal(on.others, []string{"fx-other/app"}) {
		t.Errorf("on fx-w: services %v, jobs %v, others %v", names, on.jobs, on.others)
	}

	// Refusals, before anything changes.
	if err := fenceWith(FenceOptions{}); err == nil || !strings.Contains(err.Error(), "run kip node fence fx-w --powered-off") {
		t.Errorf("fence without --powered-off off a terminal: %v", err)
	}
	kubelet, err := net.Listen("tcp", fenceKubelet+":10250")
	if err != nil {
		t.Fatal(err)
	}
	if err := fenceWith(FenceOptions{PoweredOff: true}); err == nil || !strings.Contains(err.Error(), "the kubelet of fx-w still answers the server at 127.0.0.37:10250") {
		t.Errorf("fence while the kubelet answers: %v", err)
	}
	kubelet.Close()
	serverUp = false
	if err := fenceWith(FenceOptions{PoweredOff: true}); err == nil || !strings.Contains(err.Error(), "the fence cannot go ahead without that check") {
		t.Errorf("fence with the server unreachable: %v", err)
	}
	serverUp = true
	if rec, err := cluster.ReadNodes(ctx, cl.Dynamic); err != nil || rec.Workers["fx-w"].Fence != nil {
		t.Fatalf("the refusals recorded a fence: %+v (%v)", rec.Workers["fx-w"], err)
	}

	// The fence, with console-api down while it marks stale and only stopped: it waits, and
	// taints fx-w only once console-api is back and has scaled their StatefulSets to zero;
	// otherwise their controller would start their pods again on another node when the taint
	// deletes those on fx-w.
	console.Down()
	fenced := make(chan error, 1)
	go func() { fenced <- fenceWith(FenceOptions{PoweredOff: true}) }()
	for _, name := range []string{"stale", "only"} {
		ref := service.Ref{Project: "fx", Environment: "prod", Name: name}
		if err := kube.Poll(ctx, time.Minute, "the fence to mark "+name+" stopped", func(ctx context.Context) (bool, string, error) {
			s, err := service.Get(ctx, cl.Dynamic, ref)
			return err == nil && s.FenceStop == "fx-w", "", err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "fx-w", metav1.GetOptions{}); err != nil || hasTaint(n, cluster.OutOfServiceTaint) {
		t.Errorf("fx-w tainted while console-api is down (%v)", err)
	}
	for _, name := range []string{"stale", "only"} {
		if sts, err := cl.Kube.AppsV1().StatefulSets("fx-prod").Get(ctx, name, metav1.GetOptions{}); err != nil || ptr.Deref(sts.Spec.Replicas, 1) != 1 {
			t.Errorf("StatefulSet %s scaled while console-api is down (%v)", name, err)
		}
	}
	console.Up()
	if err := <-fenced; err != nil {
		t.Fatalf("fence: %v\n%s", err, out)
	}
	t.Logf("kip node fence fx-w --powered-off:\n%s", out)
	// cur runs again: a new pod of its StatefulSet, Ready on a node that is not fx-w, where the
	// fence says it runs.
	cur, err := cl.Kube.CoreV1().Pods("fx-prod").Get(ctx, "cur-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if owner := metav1.GetControllerOf(cur); owner == nil || owner.Kind != "StatefulSet" || owner.Name != "cur" || cur.UID == oldCur ||
		cur.Spec.NodeName == "fx-w" || cur.Spec.NodeName == "" || !podutils.IsPodReady(cur) {
		t.Errorf("cur's pod after the fence: owner %v, on %q, the pod it ran on fx-w %v, ready %v", owner, cur.Spec.NodeName, cur.UID == oldCur, podutils.IsPodReady(cur))
	}
	for _, name := range []string{"stale", "only"} {
		if pods, err := service.Pods(ctx, cl.Kube, &service.Service{Ref: service.Ref{Project: "fx", Environment: "prod", Name: name}}); err != nil || len(pods) > 0 {
			t.Errorf("service %s, stopped by the fence, has %d pods (%v)", name, len(pods), err)
		}
	}
	for _, want := range []string{
		"service cur in fx-prod starts on another node (current copies on fx-two)",
		"service stale in fx-prod stays stopped: no node but fx-w holds a copy of its data known to be current, and older data was not accepted",
		"service only in fx-prod stays stopped: its only copy of some volume is on fx-w",
		"Job fx-prod/nightly is suspended",
		"Service cur in fx-prod runs again on " + cur.Spec.NodeName + " (current copies on fx-two)",
		"Service stale in fx-prod stays stopped: no node but fx-w holds a copy of its data known to be current, and older data was not accepted; rejoin fx-w with kip node add 192.0.2.51, or start it on the older copies with kip service start stale --project fx --environment prod --accept-stale-data",
		"Service only in fx-prod stays stopped: its only copy of some volume is on fx-w, so it stays stopped until fx-w rejoins (kip node add 192.0.2.51); if fx-w is lost, " +
			"delete the service with 'kip service delete only --project fx --environment prod --delete-data' and restore it with 'kip backup restore <backup> --namespace fx-prod'",
		"Pod fx-other/app is no Kipper workload and holds a single-node volume on fx-w",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the fence's output lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "service off in") {
		t.Errorf("the fence acted on service off, which its operator had stopped")
	}
	rec, err := cluster.ReadNodes(ctx, cl.Dynamic)
	if err != nil {
		t.Fatal(err)
	}
	fence := rec.Workers["fx-w"].Fence
	stoppedBy := func(f *cluster.FenceRecord) map[string]string {
		m := map[string]string{}
		for _, s := range f.Stopped {
			m[s.Name] = s.Why
		}
		return m
	}
	wantStopped := map[string]string{"stale": longhorn.DataStale, "only": longhorn.DataOnlyThere}
	if fence == nil || fence.BootID != w.Status.NodeInfo.BootID || !fence.PoweredOff ||
		!slices.Equal(fence.Suspended, []string{"fx-prod/nightly"}) || !reflect.DeepEqual(stoppedBy(fence), wantStopped) {
		t.Errorf("the fence's record: %+v", fence)
	}
	for name, want := range map[string]string{"cur": "", "stale": "fx-w", "only": "fx-w", "off": ""} {
		s, err := service.Get(ctx, cl.Dynamic, service.Ref{Project: "fx", Environment: "prod", Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if s.FenceStop != want || s.Stopped != (want != "" || name == "off") {
			t.Errorf("service %s after the fence: stopped %v, fence mark %q, want %q", name, s.Stopped, s.FenceStop, want)
		}
	}
	if j, err := cl.Kube.BatchV1().Jobs("fx-prod").Get(ctx, "nightly", metav1.GetOptions{}); err != nil || !ptr.Deref(j.Spec.Suspend, false) {
		t.Errorf("Job nightly not suspended (%v)", err)
	}
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "fx-w", metav1.GetOptions{})
	if err != nil || cluster.NodeStatus(n) != cluster.NodeOutOfService {
		t.Errorf("fx-w after the fence: %v", err)
	}
	if left, err := kipperPodsOn(ctx, cl, "fx-w"); err != nil || len(left) > 0 {
		t.Errorf("Kipper pods left on fx-w: %d (%v)", len(left), err)
	}

	// Run again: every step already done (none started), though the Job's pod is gone from the node now, and
	// the record still holds what the first run stopped.
	if err := fenceWith(FenceOptions{PoweredOff: true}); err != nil || strings.Contains(out.String(), "…") || strings.Count(out.String(), "✔") != 5 {
		t.Errorf("the fence run again: %v\n%s", err, out)
	}
	if rec, err := cluster.ReadNodes(ctx, cl.Dynamic); err != nil || !slices.Equal(rec.Workers["fx-w"].Fence.Suspended, []string{"fx-prod/nightly"}) ||
		!reflect.DeepEqual(stoppedBy(rec.Workers["fx-w"].Fence), wantStopped) {
		t.Errorf("the fence's record after it ran again: %+v (%v)", rec.Workers["fx-w"].Fence, err)
	}

	// kip service start: the fence's check.
	so := &service.ServiceOptions{Options: service.Options{Kube: env2.Kube, Printer: env2.Printer, Prompter: env2.Prompter}}
	so.Ref = service.Ref{Project: "fx", Environment: "prod", Name: "only"}
	if err := service.Start(ctx, so); err == nil || !strings.Contains(err.Error(), "kip node fence of fx-w stopped service only in fx-prod, and its only copy of some volume is on fx-w, so it stays stopped until fx-w rejoins (kip node add 192.0.2.51)") {
		t.Errorf("start only: %v", err)
	}
	so.Ref.Name = "stale"
	if err := service.Start(ctx, so); err == nil || !strings.Contains(err.Error(), "run kip service start stale --project fx --environment prod --accept-stale-data") {
		t.Errorf("start stale without consent: %v", err)
	}
	// kip service info: where each copy of the Longhorn volume is, and its copies unset with the
	// number Longhorn keeps.
	var info bytes.Buffer
	so.Out = &info
	if err := service.ShowInfo(ctx, so); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Longhorn volume pvc-fx-prod-data-stale-0, copies on fx-srv (may be older), fx-w (current)",
		"Copies:       unset (one copy of its data kept); record them with 'kip service update stale --project fx --environment prod --copies 1'"} {
		if !strings.Contains(info.String(), want) {
			t.Errorf("kip service info stale lacks %q:\n%s", want, info.String())
		}
	}
	so.AcceptStale = true
	if err := service.Start(ctx, so); err != nil {
		t.Errorf("kip service start stale --accept-stale-data: %v", err)
	}
	if s, err := service.Get(ctx, cl.Dynamic, so.Ref); err != nil || s.FenceStop != "" || s.Stopped {
		t.Errorf("stale after kip service start --accept-stale-data: %+v (%v)", s, err)
	}
	if p, err := cl.Kube.CoreV1().Pods("fx-prod").Get(ctx, "stale-0", metav1.GetOptions{}); err != nil || p.Spec.NodeName == "fx-w" || !podutils.IsPodReady(p) {
		t.Errorf("stale's pod after kip service start --accept-stale-data: %v", err)
	}

	// A rejoin stopped after it lifted the taint (or a fence killed before its taint): fx-w
	// Ready and untainted, but kip's record still holds the fence, which is the truth. fx-w's
	// own copy of only's dump volume does not count: only stays stopped.
	so.AcceptStale = false
	so.Ref.Name = "only"
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "fx-w", metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		if n, err = cl.Kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = cl.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := service.Start(ctx, so); err == nil || !strings.Contains(err.Error(), "its only copy of some volume is on fx-w, so it stays stopped until fx-w rejoins") {
		t.Errorf("start only with fx-w untainted and Ready but its fence recorded: %v", err)
	}
	// Once the rejoin lifted the fence from the record, fx-w counts again: its copy is current.
	if _, err := cluster.UpdateNodes(ctx, cl.Dynamic, func(n *cluster.Nodes) error {
		w := n.Workers["fx-w"]
		w.Fence = nil
		n.Workers["fx-w"] = w
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := service.Start(ctx, so); err != nil {
		t.Errorf("kip service start only once fx-w rejoined: %v", err)
	}
	if s, err := service.Get(ctx, cl.Dynamic, so.Ref); err != nil || s.FenceStop != "" || s.Stopped {
		t.Errorf("only once fx-w rejoined: %+v (%v)", s, err)
	}
}

// deadNode writes a Node no kwok plays, NotReady for two minutes, as the node lifecycle
// controller sees a worker that stopped reporting; it is cordoned, so that nothing is
// scheduled there.
func deadNode(t *testing.T, cl *kube.Clients, name string) *corev1.Node {
	t.Helper()
	ctx := t.Context()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	n, err := cl.Kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	ago := metav1.NewTime(time.Now().Add(-2 * time.Minute))
	// The node controllers change a new Node too (its pod CIDR, its taints): write its status on
	// the latest version.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n, err = cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletStopped",
			LastHeartbeatTime: ago, LastTransitionTime: ago}}
		n.Status.NodeInfo.BootID = name + "-boot-1"
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fenceKubelet}}
		n, err = cl.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// longhornClaim makes a claim of ns bound to a Longhorn volume (ReadWriteOnce) and returns the
// volume's name, which is also its Longhorn volume's.
func longhornClaim(t *testing.T, cl *kube.Clients, ns, claim string) string {
	t.Helper()
	ctx := t.Context()
	name := "pvc-" + ns + "-" + claim
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: claim},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: longhorn.Driver, VolumeHandle: name}},
	}}
	if _, err := cl.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lv := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhorn.Namespace}, Spec: testenv.LonghornVolumeSpec(1<<30, 1)}
	volumes := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace)
	if _, err := volumes.Create(ctx, lv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeName: name, StorageClassName: ptr.To(""),
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}
	if _, err := cl.Kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), claim, metav1.DeleteOptions{})
		_ = cl.Kube.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = volumes.Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// attach writes the volume attachment Kubernetes keeps for pv on node.
func attach(t *testing.T, cl *kube.Clients, pv, node string) {
	t.Helper()
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-" + pv}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: longhorn.Driver, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}}}
	if _, err := cl.Kube.StorageV1().VolumeAttachments().Create(t.Context(), va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{})
	})
}

// kipperService writes a Kipper Service object.
// kipperProject writes a Kipper Project with one environment until t ends.
func kipperProject(t *testing.T, cl *kube.Clients, name, env string) {
	t.Helper()
	project := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Project",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"environments": []any{map[string]any{"name": env}}}}}
	if _, err := cl.Dynamic.Resource(service.ProjectsGVR).Create(t.Context(), project, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Dynamic.Resource(service.ProjectsGVR).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func kipperService(t *testing.T, cl *kube.Clients, ns, name, typ string, stopped bool) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"type": typ, "storage": "1Gi", "stopped": stopped}}}
	if _, err := cl.Dynamic.Resource(service.ServicesGVR).Namespace(ns).Create(t.Context(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pod runs a bare pod on node (kwok's, or none when kwok no longer manages the node), mounting
// claims ("" none), each as the volume named as its claim's first word (a StatefulSet's data-db-0
// as data).
func pod(t *testing.T, cl *kube.Clients, ns, name, node string, labels map[string]string, claims ...string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: corev1.PodSpec{
		NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "kip.invalid/app"}}}}
	for _, c := range claims {
		if c == "" {
			continue
		}
		volume, _, _ := strings.Cut(c, "-")
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: volume,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	if _, err := cl.Kube.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
}

// consoleAPI runs the console stand-in as console-api until t ends, acting on each Service delay
// after it changed. Call it before the test makes its Projects: its cleanup, which runs after
// theirs, stops the stand-in and lets go of the Projects deleted meanwhile (its finalizer).
func consoleAPI(t *testing.T, cl *kube.Clients, delay time.Duration) *consolestandin.Standin {
	t.Helper()
	s := &consolestandin.Standin{Kube: cl.Kube, Dynamic: cl.Dynamic, Image: "kip.invalid/service", CopyHolders: cluster.CopyHolders,
		Interval: time.Second, Delay: delay, Logf: t.Logf}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-done
		projects := cl.Dynamic.Resource(service.ProjectsGVR)
		list, err := projects.List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		for _, p := range list.Items {
			if p.GetDeletionTimestamp() != nil {
				p.SetFinalizers(slices.DeleteFunc(p.GetFinalizers(), func(f string) bool { return f == consolestandin.Finalizer }))
				_, _ = projects.Update(context.Background(), &p, metav1.UpdateOptions{})
			}
		}
	})
	return s
}

// adopted waits until the StatefulSet console-api makes for each service of ns has adopted the
// pod the test ran for it (the service's pod 0), and returns those pods' UIDs by service.
func adopted(t *testing.T, cl *kube.Clients, ns string, services ...string) map[string]types.UID {
	t.Helper()
	uids := map[string]types.UID{}
	for _, name := range services {
		if err := kube.Poll(t.Context(), time.Minute, "StatefulSet "+name+" to adopt its pod", func(ctx context.Context) (bool, string, error) {
			p, err := cl.Kube.CoreV1().Pods(ns).Get(ctx, name+"-0", metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			uids[name] = p.UID
			owner := metav1.GetControllerOf(p)
			return owner != nil && owner.Kind == "StatefulSet" && owner.Name == name, "", nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return uids
}

// TestFenceWaitsForScaleDown runs the fence's services step against the real API server with
// console-api (the console stand-in) down once it has made the service's StatefulSet: the step
// marks the service stopped and then waits, failing when its context ends rather than going on
// to the taint, and its check does not count it done; once console-api is up again and has
// scaled the StatefulSet to zero (its controller has seen it), the step is done.
func TestFenceWaitsForScaleDown(t *testing.T) {
	_, cl := apiCluster(t, "")
	ctx := t.Context()
	console := consoleAPI(t, cl, 0)
	const ns = "sd-prod"
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{service.ProjectLabel: "sd"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	kipperProject(t, cl, "sd", "prod")
	kipperService(t, cl, ns, "db", "postgres", false)
	recordWorkers(t, cl, map[string]cluster.Worker{"sd-w": {Host: "192.0.2.61", State: cluster.WorkerReady}})
	replicas := func(want int32) {
		t.Helper()
		if err := kube.Poll(ctx, time.Minute, fmt.Sprintf("StatefulSet db at %d replicas", want), func(ctx context.Context) (bool, string, error) {
			sts, err := cl.Kube.AppsV1().StatefulSets(ns).Get(ctx, "db", metav1.GetOptions{})
			return err == nil && ptr.Deref(sts.Spec.Replicas, 1) == want, "", ignoreFound(err)
		}); err != nil {
			t.Fatal(err)
		}
	}
	replicas(1)
	console.Down()
	ref := service.Ref{Project: "sd", Environment: "prod", Name: "db"}
	f := &fencer{o: &FenceOptions{Worker: "sd-w"}, cl: cl, intent: fenceIntent{Node: "sd-w",
		Services: []fencedService{{Ref: ref, Data: longhorn.DataOnlyThere, Why: "its only copy of some volume is on sd-w"}}}}
	step := f.servicesStep()
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := step.Apply(short); err == nil || !strings.Contains(err.Error(), "StatefulSet sd-prod/db at 1 replicas") ||
		!strings.Contains(err.Error(), "kip does not taint sd-w before console-api has scaled them to zero") {
		t.Fatalf("the services step with console-api down: %v", err)
	}
	if s, err := service.Get(ctx, cl.Dynamic, ref); err != nil || s.FenceStop != "sd-w" || !s.Stopped {
		t.Errorf("the service after the step: %+v, %v", s, err)
	}
	if done, err := step.Check(ctx); err != nil || done {
		t.Errorf("the step's check with the StatefulSet at 1 replica: %v, %v; want not done", done, err)
	}
	console.Up()
	if err := step.Apply(ctx); err != nil {
		t.Fatalf("the services step once console-api is up again: %v", err)
	}
	replicas(0)
	if done, err := step.Check(ctx); err != nil || !done {
		t.Errorf("the step's check with the StatefulSet at zero: %v, %v; want done", done, err)
	}
}

// TestFenceTaintRechecks runs the fence's taint step against the real API server, as after the
// operator answered: on a worker whose node reports Ready again (kwok plays it), and for a
// service judged to start elsewhere whose other copy is no longer current. Each time the step
// refuses, saying what to do, and the node stays untainted.
func TestFenceTaintRechecks(t *testing.T) {
	env, cl := apiCluster(t, "")
	ctx := t.Context()
	deadNode(t, cl, "tr-d")
	kipperProject(t, cl, "tr", "prod")
	for _, ns := range []string{longhorn.Namespace, "tr-prod"} {
		if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().Namespaces().Delete(context.Background(), "tr-prod", metav1.DeleteOptions{})
	})
	kipperService(t, cl, "tr-prod", "db", "redis", false)
	pv := longhornClaim(t, cl, "tr-prod", "data-db-0")
	replica(t, cl, pv+"-tr-d", pv, "tr-d", true)
	replica(t, cl, pv+"-tr-other", pv, "tr-other", false) // current when kip examined it, no longer
	ref := service.Ref{Project: "tr", Environment: "prod", Name: "db"}
	moved := &fencer{o: &FenceOptions{Worker: "tr-d"}, cl: cl, worker: cluster.Worker{Host: "192.0.2.72", State: cluster.WorkerReady},
		intent: fenceIntent{Node: "tr-d", Services: []fencedService{{Ref: ref, Data: longhorn.DataCurrent, CurrentOn: []string{"tr-other"}}}}}
	err := moved.taintStep().Apply(ctx)
	if err == nil || !strings.Contains(err.Error(), "the copies of service db in tr-prod changed since kip examined them (without tr-d its data is now stale)") ||
		!strings.Contains(err.Error(), "run kip node fence tr-d again") {
		t.Errorf("the taint step with a copy no longer current: %v", err)
	}
	if n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "tr-d", metav1.GetOptions{}); err != nil || hasTaint(n, cluster.OutOfServiceTaint) {
		t.Errorf("tr-d after the refused taint: %v", err)
	}

	env.AddNode(t, "tr-w", testenv.NodeOptions{})
	f := &fencer{o: &FenceOptions{Worker: "tr-w"}, cl: cl, worker: cluster.Worker{Host: "192.0.2.71", State: cluster.WorkerReady}, intent: fenceIntent{Node: "tr-w"}}
	err = f.taintStep().Apply(ctx)
	if err == nil || !strings.Contains(err.Error(), "worker tr-w reports Ready again, so kip does not taint it") || !strings.Contains(err.Error(), "kip node add 192.0.2.71") {
		t.Errorf("the taint step on a Ready worker: %v", err)
	}
	if n, err := cl.Kube.CoreV1().Nodes().Get(t.Context(), "tr-w", metav1.GetOptions{}); err != nil || hasTaint(n, cluster.OutOfServiceTaint) {
		t.Errorf("tr-w after the refused taint: %v", err)
	}
}
