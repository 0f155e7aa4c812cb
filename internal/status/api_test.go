package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// The fixture's nodes: a Ready server, a fenced worker and a NotReady worker.
const (
	srvNode    = "kip-srv"
	fencedNode = "kip-w1"
	deadNode   = "kip-w2"
	recordKip  = "v0.3.0"
)

// fixture is a cluster kip installed on local storage: three nodes, the local-path class, a
// local volume, and two unfinished operations (one a move to Longhorn).
type fixture struct {
	env    *testenv.Env
	c      *kube.Clients
	pinned string
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	env := testenv.Get(tb)
	c, err := kube.NewClients(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	pinned, err := pinnedK3s()
	if err != nil {
		tb.Fatal(err)
	}
	f := &fixture{env: env, c: c, pinned: pinned}
	ctx := context.Background()

	env.AddNode(tb, srvNode, testenv.NodeOptions{Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}})
	env.AddNode(tb, fencedNode, testenv.NodeOptions{Taints: []corev1.Taint{{Key: cluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}})
	for _, name := range []string{srvNode, fencedNode} {
		f.setKubeletVersion(tb, name, pinned)
	}
	// A node no kubelet (nor kwok) keeps: it reports NotReady.
	dead := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: deadNode, Labels: map[string]string{corev1.LabelHostname: deadNode}}}
	if _, err := c.Kube.CoreV1().Nodes().Create(ctx, dead, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Kube.CoreV1().Nodes().Delete(context.Background(), deadNode, metav1.DeleteOptions{}) })
	f.updateNodeStatus(tb, deadNode, func(n *corev1.Node) {
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady",
			Message: "container runtime is down", LastHeartbeatTime: now, LastTransitionTime: now}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.12"}}
	})

	class := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: LocalPathClass, Annotations: map[string]string{defaultClassAnnot: "true"}},
		Provisioner: "rancher.io/local-path",
	}
	if _, err := c.Kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	f.localPV(tb, "pvc-db", "shop", "data-db-0", "2Gi")
	f.setRecord(tb, cluster.StorageLocal)
	// kip's CRDs as install applies them, with kip's labels (the environment installed them
	// without).
	comps, err := recordComponents(cluster.Record{Profile: "nano", Storage: cluster.StorageLocal, Server: "192.0.2.10", KipVersion: recordKip})
	if err != nil {
		tb.Fatal(err)
	}
	for _, comp := range comps {
		if comp.Name == "kipper-crds" {
			if err := kube.Apply(ctx, c, comp.Objects, kube.ApplyOptions{Force: true}); err != nil {
				tb.Fatal(err)
			}
		}
	}

	for name, p := range map[string]workflow.Progress{
		"op-node-add-w3": {Workflow: "node-add-w3", StartedBy: "kip node add 192.0.2.13 by alice@laptop, pid 42", Status: workflow.StatusFailed,
			Step: "join", Error: "k3s-agent did not start", StartedAt: time.Now().Add(-time.Hour)},
		"op-" + service.MoveWorkflowPrefix + "shop-db": {Workflow: service.MoveWorkflowPrefix + "shop-db", StartedBy: "kip service storage longhorn db --project shop by bob@ci, pid 7",
			Status: workflow.StatusStopped, Step: "copy", StartedAt: time.Now().Add(-time.Minute)},
	} {
		if _, err := kube.UpdateRecord(ctx, c.Dynamic, kube.ClusterRecords(), name, 1, func(rec *workflow.Progress, _ bool) error {
			*rec = p
			return nil
		}); err != nil {
			tb.Fatal(err)
		}
	}
	return f
}

func (f *fixture) setKubeletVersion(tb testing.TB, name, v string) {
	tb.Helper()
	f.updateNodeStatus(tb, name, func(n *corev1.Node) { n.Status.NodeInfo.KubeletVersion = v })
}

// updateNodeStatus changes a Node's status, again when a controller or kwok wrote it meanwhile.
func (f *fixture) updateNodeStatus(tb testing.TB, name string, mutate func(*corev1.Node)) {
	tb.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := f.c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(n)
		_, err = f.c.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// localPV creates a local-path volume on the server, bound to namespace/claim.
func (f *fixture) localPV(tb testing.TB, name, namespace, claim, size string) {
	tb.Helper()
	if err := f.createLocalPV(cluster.LocalStorageDir, srvNode, name, namespace, claim, size); err != nil {
		tb.Fatal(err)
	}
}

// createLocalPV creates a local-path volume in dir on node, bound to namespace/claim.
func (f *fixture) createLocalPV(dir, node, name, namespace, claim, size string) error {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              LocalPathClass,
			ClaimRef:                      &corev1.ObjectReference{Namespace: namespace, Name: claim},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: fmt.Sprintf("%s/%s_%s_%s", dir, name, namespace, claim),
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	_, err := f.c.Kube.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (f *fixture) setRecord(tb testing.TB, storage string) {
	tb.Helper()
	_, err := cluster.UpdateRecord(context.Background(), f.c.Dynamic, func(rec *cluster.Record, _ bool) error {
		*rec = cluster.Record{Profile: "nano", Storage: storage, Network: cluster.NetworkVXLAN, Server: "192.0.2.10",
			KipVersion: recordKip, Versions: map[string]string{"k3s": f.pinned}, InstalledAt: time.Now().UTC()}
		if storage == cluster.StorageLonghorn {
			rec.Profile, rec.Monitoring = "small", cluster.Monitoring{Prometheus: true, Loki: true}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func (f *fixture) options(out *bytes.Buffer) *Options {
	return &Options{Out: out, Kube: func() (*kube.Clients, error) { return f.c, nil }, KipVersion: recordKip}
}

func findNode(t *testing.T, r *Report, name string) Node {
	t.Helper()
	i := slices.IndexFunc(r.Nodes, func(n Node) bool { return n.Name == name })
	if i < 0 {
		t.Fatalf("node %s not in the report: %+v", name, r.Nodes)
	}
	return r.Nodes[i]
}

func findCheck(d *Diagnosis, name, node string) *Check {
	for i, c := range d.Checks {
		if c.Name == name && c.Node == node {
			return &d.Checks[i]
		}
	}
	return nil
}

// TestAPI runs status and doctor through the API only, on a local-storage cluster and then on a
// Longhorn one.
func TestAPI(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	t.Run("status", func(t *testing.T) {
		var out bytes.Buffer
		r, err := Collect(ctx, f.options(&out))
		if err != nil {
			t.Fatal(err)
		}
		if c := r.Cluster; !c.Recorded || c.Storage != cluster.StorageLocal || c.Profile != "nano" || c.Monitoring == nil || c.Monitoring.Prometheus || c.KipVersion != recordKip {
			t.Errorf("cluster %+v", c)
		}
		srv := findNode(t, r, srvNode)
		if srv.Role != cluster.RoleServer || srv.Status != cluster.NodeReady || srv.K3sVersion != f.pinned {
			t.Errorf("server %+v", srv)
		}
		if n := findNode(t, r, fencedNode); n.Role != cluster.RoleWorker || n.Status != cluster.NodeOutOfService {
			t.Errorf("fenced worker %+v", n)
		}
		if n := findNode(t, r, deadNode); n.Status != cluster.NodeNotReady || n.InternalIP != "192.0.2.12" {
			t.Errorf("dead worker %+v", n)
		}
		if r.Nodes[0].Role != cluster.RoleServer {
			t.Errorf("servers are not listed first: %+v", r.Nodes)
		}
		s := srv.Storage
		if s == nil || s.VolumeCount != 1 || s.Volumes[0].Name != "pvc-db" || s.Volumes[0].Claim != "data-db-0" || s.Volumes[0].Namespace != "shop" ||
			s.Volumes[0].SizeBytes != 2<<30 || s.Volumes[0].UsedBytes != nil || len(s.Disks) != 0 {
			t.Errorf("server storage %+v", s)
		}
		if len(r.Operations) != 2 || r.Operations[0].Workflow != "node-add-w3" || r.Operations[0].Kind != KindOperation ||
			r.Operations[0].Resume != "kip node add 192.0.2.13" || r.Operations[1].Kind != KindMoveToLonghorn {
			t.Errorf("operations %+v", r.Operations)
		}
		if !slices.ContainsFunc(r.Warnings, func(w string) bool { return w == "node kip-w2 is NotReady" }) {
			t.Errorf("warnings %q", r.Warnings)
		}
		if !slices.ContainsFunc(r.Skipped, func(s string) bool { return strings.Contains(s, "free disk") && strings.Contains(s, "--ssh-key") }) {
			t.Errorf("skipped %q", r.Skipped)
		}
		if len(r.Components) == 0 {
			t.Errorf("no components")
		}

		// The JSON shape.
		o := f.options(&out)
		o.JSON = true
		if err := Run(ctx, o); err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		for _, key := range []string{"cluster", "nodes", "components", "operations", "warnings", "skipped"} {
			if _, ok := doc[key]; !ok {
				t.Errorf("JSON lacks %q", key)
			}
		}
		nodes := doc["nodes"].([]any)
		first := nodes[0].(map[string]any)
		for _, key := range []string{"name", "role", "status", "k3sVersion", "storage"} {
			if _, ok := first[key]; !ok {
				t.Errorf("JSON node lacks %q: %v", key, first)
			}
		}
		vol := first["storage"].(map[string]any)["volumes"].([]any)[0].(map[string]any)
		if vol["name"] != "pvc-db" || vol["storage"] != "local" || vol["sizeBytes"] != float64(2<<30) {
			t.Errorf("JSON volume %v", vol)
		}
		if op := doc["operations"].([]any)[1].(map[string]any); op["kind"] != KindMoveToLonghorn || op["status"] != "stopped" {
			t.Errorf("JSON operation %v", op)
		}

		out.Reset()
		if err := Run(ctx, f.options(&out)); err != nil {
			t.Fatal(err)
		}
		text := out.String()
		t.Logf("kip status:\n%s", text)
		for _, row := range []string{"kip-w1 worker OutOfService " + f.pinned + " - -", "kip-w2 worker NotReady - 192.0.2.12 -", "pvc-db shop/data-db-0 local - 2.0 GiB"} {
			if !slices.ContainsFunc(strings.Split(text, "\n"), func(l string) bool { return strings.Join(strings.Fields(l), " ") == row }) {
				t.Errorf("text lacks the row %q", row)
			}
		}
		for _, want := range []string{"Cluster: local storage, nano profile, monitoring off", "Unfinished kip operations", "continue it: kip node add 192.0.2.13", "Moves to Longhorn not finished",
			service.MoveWorkflowPrefix + "shop-db: stopped at step copy", "! node kip-w2 is NotReady", "Not looked at"} {
			if !strings.Contains(text, want) {
				t.Errorf("text lacks %q", want)
			}
		}
	})

	t.Run("doctor", func(t *testing.T) {
		var out bytes.Buffer
		o := f.options(&out)
		d := Diagnose(ctx, o)
		for _, c := range d.Checks {
			t.Logf("%-8s %-14s %-8s %s | %s", c.Status, c.Name, c.Node, c.Detail, c.Fix)
		}
		want := []struct {
			name, node string
			status     CheckStatus
			detail     string
		}{
			{"api", "", StatusOK, "answered with kip's credentials"},
			{"clock", "", StatusOK, "the API server's clock"},
			{"node", srvNode, StatusOK, "Ready"},
			{"node", fencedNode, StatusWarn, "OutOfService"},
			{"node", deadNode, StatusFail, "NotReady (KubeletNotReady: container runtime is down)"},
			{"k3s version", "", StatusWarn, "kip-w2 reports no k3s version"},
			{"storage", "", StatusOK, "local-path is the default StorageClass"},
			{"kip version", "", StatusOK, "this kip installed the cluster"},
			{"operation", "", StatusWarn, "node-add-w3 is unfinished: failed at step join"},
			{"host checks", "", StatusSkipped, "SSH is not set up"},
		}
		for _, w := range want {
			c := findCheck(d, w.name, w.node)
			if c == nil || c.Status != w.status || !strings.Contains(c.Detail, w.detail) {
				t.Errorf("check %s %s: %+v, want %s with %q", w.name, w.node, c, w.status, w.detail)
			}
		}
		if d.Summary.Fail != 1 || d.Summary.Skipped != 1 {
			t.Errorf("summary %+v", d.Summary)
		}

		err := Doctor(ctx, o)
		var failed *FailedError
		if !errors.As(err, &failed) || failed.Failed != 1 || err.Error() != fmt.Sprintf("1 of %d checks failed", len(d.Checks)) {
			t.Fatalf("Doctor returned %v", err)
		}
		text := out.String()
		for _, want := range []string{"✗ node (kip-w2): NotReady", "    fix: if k3s-agent on the worker logs 'not authorized'", "kip node add 192.0.2.12",
			"- host checks: SSH is not set up", "    to run them: pass --ssh-key", "1 failed, "} {
			if !strings.Contains(text, want) {
				t.Errorf("doctor text lacks %q:\n%s", want, text)
			}
		}

		out.Reset()
		o.JSON, o.APIOnly = true, true
		if err := Doctor(ctx, o); !errors.As(err, &failed) {
			t.Fatalf("Doctor -o json returned %v", err)
		}
		var doc Diagnosis
		if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if c := findCheck(&doc, "host checks", ""); c == nil || c.Status != StatusSkipped || !strings.Contains(c.Detail, "--api-only") {
			t.Errorf("host checks with --api-only: %+v", c)
		}
		if !bytes.Contains(out.Bytes(), []byte(`"status": "fail"`)) || !bytes.Contains(out.Bytes(), []byte(`"summary": {`)) {
			t.Errorf("JSON:\n%s", out.String())
		}
	})

	t.Run("doctor passes without the dead node", func(t *testing.T) {
		if err := f.c.Kube.CoreV1().Nodes().Delete(ctx, deadNode, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := Doctor(ctx, f.options(&out)); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
	})

	t.Run("longhorn", func(t *testing.T) {
		f.setRecord(t, cluster.StorageLonghorn)
		t.Cleanup(func() { f.setRecord(t, cluster.StorageLocal) })
		f.longhorn(t)
		var out bytes.Buffer
		r, err := Collect(ctx, f.options(&out))
		if err != nil {
			t.Fatal(err)
		}
		srv := findNode(t, r, srvNode)
		s := srv.Storage
		if s == nil || len(s.Disks) != 2 || !s.Low || !strings.Contains(s.Warning, "less than 5.0 GiB") {
			t.Fatalf("server storage %+v", s)
		}
		if d := s.Disks[0]; d.Name != "default" || *d.SchedulableBytes != 4<<30 || !*d.Eligible {
			t.Errorf("disk %+v (room %d)", d, *d.SchedulableBytes)
		}
		if d := s.Disks[1]; d.Name != "spare" || *d.Eligible {
			t.Errorf("disk %+v", d)
		}
		// The Longhorn volume and the local one (the registry stays local on the server).
		if s.VolumeCount != 2 || s.Volumes[0].Name != "pvc-lh" || *s.Volumes[0].UsedBytes != 3<<30 || s.Volumes[0].Storage != cluster.StorageLonghorn ||
			s.Volumes[0].Claim != "data-pg-0" || s.Volumes[1].Name != "pvc-db" {
			t.Errorf("volumes %+v", s.Volumes)
		}
		if c := r.Cluster; c.Monitoring == nil || !c.Monitoring.Prometheus {
			t.Errorf("cluster %+v", c)
		}
		// The server's copy of pvc-lh is not current (Longhorn never reported it healthy), so a
		// current copy on worker kip-w1 is the volume's only one: listed and warned about.
		if len(r.WorkerReplicas) != 0 {
			t.Errorf("worker copies before one exists: %+v", r.WorkerReplicas)
		}
		rep := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: "pvc-lh-r-2", Namespace: longhorn.Namespace}}
		rep.Spec.VolumeName, rep.Spec.NodeID, rep.Spec.DiskID, rep.Spec.VolumeSize = "pvc-lh", fencedNode, "default", 10<<30
		rep.Spec.DataEngine, rep.Spec.HealthyAt = "v1", "2026-12-01T10:00:00Z"
		if _, err := f.c.Longhorn.LonghornV1beta2().Replicas(longhorn.Namespace).Create(ctx, rep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			f.c.Longhorn.LonghornV1beta2().Replicas(longhorn.Namespace).Delete(context.Background(), "pvc-lh-r-2", metav1.DeleteOptions{})
		})
		if r, err = Collect(ctx, f.options(&out)); err != nil {
			t.Fatal(err)
		}
		want := "Longhorn volume pvc-lh (claim shop/data-pg-0) has no current copy on the server, only on " + fencedNode
		if len(r.WorkerReplicas) != 1 || r.WorkerReplicas[0].Volume != "pvc-lh" || !slices.ContainsFunc(r.Warnings, func(w string) bool { return strings.HasPrefix(w, want) }) {
			t.Errorf("worker copies %+v, warnings %q", r.WorkerReplicas, r.Warnings)
		}
		d := Diagnose(ctx, f.options(&out))
		if c := findCheck(d, "storage", ""); c == nil || c.Status != StatusOK {
			t.Errorf("storage check %+v", c)
		}
		if c := findCheck(d, "longhorn disk", srvNode); c == nil || c.Status != StatusWarn || !strings.Contains(c.Detail, "4.0 GiB available for scheduling") {
			t.Errorf("longhorn disk check %+v", c)
		}
		out.Reset()
		if err := Run(ctx, f.options(&out)); err != nil {
			t.Fatal(err)
		}
		t.Logf("kip status:\n%s", out.String())
		if !strings.Contains(out.String(), "Longhorn disk default (/var/lib/longhorn): ") {
			t.Errorf("text lacks the Longhorn disk")
		}
	})
}

// longhorn installs Longhorn's traces: its namespace, the server's Longhorn node with a default
// disk that has 4 GiB left to schedule and a spare disk that allows no scheduling, a volume
// with a replica on the server.
func (f *fixture) longhorn(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}}
	if _, err := f.c.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// k3s's helm-controller installs Longhorn from this HelmChart; the environment has its CRD
	// when it carries k3s's CRDs.
	chart := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": map[string]any{"name": "longhorn", "namespace": "kube-system"},
		"spec":     map[string]any{"chart": "longhorn", "version": "1.11.3"},
	}}
	_, err := f.c.Dynamic.Resource(components.HelmCharts).Namespace("kube-system").Create(ctx, chart, metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Cleanup(func() {
			f.c.Dynamic.Resource(components.HelmCharts).Namespace("kube-system").Delete(context.Background(), "longhorn", metav1.DeleteOptions{})
		})
	case !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err):
		t.Fatal(err)
	}
	lh := f.c.Longhorn.LonghornV1beta2()
	const gib = int64(1 << 30)
	n := &longhornv1beta2.Node{ObjectMeta: metav1.ObjectMeta{Name: srvNode, Namespace: longhorn.Namespace}}
	n.Spec.AllowScheduling = true
	n.Spec.Disks = map[string]longhornv1beta2.DiskSpec{
		"default": {Type: longhornv1beta2.DiskTypeFilesystem, Path: "/var/lib/longhorn", AllowScheduling: true, StorageReserved: 30 * gib},
		"spare":   {Type: longhornv1beta2.DiskTypeFilesystem, Path: "/mnt/spare", AllowScheduling: false},
	}
	n, err = lh.Nodes(longhorn.Namespace).Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lh.Nodes(longhorn.Namespace).Delete(context.Background(), srvNode, metav1.DeleteOptions{}) })
	ready := []longhornv1beta2.Condition{{Type: longhornv1beta2.DiskConditionTypeReady, Status: longhornv1beta2.ConditionStatusTrue}}
	n.Status.DiskStatus = map[string]*longhornv1beta2.DiskStatus{
		// (100 − 30) × 100% − 66 scheduled = 4 GiB; 80 available − 25 kept free = 55.
		"default": {StorageMaximum: 100 * gib, StorageAvailable: 80 * gib, StorageScheduled: 66 * gib, Conditions: ready},
		"spare":   {StorageMaximum: 500 * gib, StorageAvailable: 500 * gib, Conditions: ready},
	}
	if _, err := lh.Nodes(longhorn.Namespace).UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-lh", Namespace: longhorn.Namespace}}
	v.Spec = testenv.LonghornVolumeSpec(10*gib, 1)
	v, err = lh.Volumes(longhorn.Namespace).Create(ctx, v, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lh.Volumes(longhorn.Namespace).Delete(context.Background(), "pvc-lh", metav1.DeleteOptions{}) })
	v.Status.ActualSize = 3 * gib
	v.Status.KubernetesStatus = longhornv1beta2.KubernetesStatus{PVName: "pvc-lh", PVCName: "data-pg-0", Namespace: "shop"}
	if _, err := lh.Volumes(longhorn.Namespace).UpdateStatus(ctx, v, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rep := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: "pvc-lh-r-1", Namespace: longhorn.Namespace}}
	rep.Spec.VolumeName, rep.Spec.NodeID, rep.Spec.DiskID, rep.Spec.VolumeSize = "pvc-lh", srvNode, "default", 10*gib
	rep.Spec.DataEngine = "v1"
	if _, err := lh.Replicas(longhorn.Namespace).Create(ctx, rep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lh.Replicas(longhorn.Namespace).Delete(context.Background(), "pvc-lh-r-1", metav1.DeleteOptions{})
	})
}

// requests counts the API requests of one status and one doctor run, on clients of their own
// (nothing discovered beforehand), and returns what status asked for.
func (f *fixture) requests(tb testing.TB) (status, doctor int64, statusPaths []string) {
	tb.Helper()
	ctx := context.Background()
	c, l := testenv.CountingClients(tb, f.env.Config)
	o := &Options{Out: &bytes.Buffer{}, Kube: func() (*kube.Clients, error) { return c, nil }, KipVersion: recordKip}
	if _, err := Collect(ctx, o); err != nil {
		tb.Fatal(err)
	}
	status, statusPaths = l.Take()
	Diagnose(ctx, o)
	doctor, _ = l.Take()
	return status, doctor, statusPaths
}

// benchNode holds the benchmark's volumes: a node that does not exist, so that they cost status
// its list request without crowding the server's largest volumes in other tests.
const benchNode = "kip-bench-node"

// addNamespaces adds n namespaces, each with a claim and a local volume bound to it.
func (f *fixture) addNamespaces(tb testing.TB, n int) {
	tb.Helper()
	ctx := context.Background()
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			name := fmt.Sprintf("kip-bench-%d", i)
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if _, err := f.c.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs <- err
				return
			}
			pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			}}
			if _, err := f.c.Kube.CoreV1().PersistentVolumeClaims(name).Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs <- err
				return
			}
			if err := f.createLocalPV(cluster.LocalStorageDir, benchNode, "pvc-bench-"+name, name, "data", "1Gi"); err != nil {
				errs <- err
			}
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// Bounds of the API requests of one run (docs/status.md): status lists each kind once for all
// the components, rather than reading each component's objects on its own (33 requests before);
// on Longhorn it also lists Kipper's services for those whose copies are unset (2 requests).
const (
	maxStatusRequests = 22
	maxDoctorRequests = 12
)

// TestRequestsBounded checks that status and doctor make as many API requests with 100 more
// namespaces, each with a volume, as without them, and no more than their bounds, on local
// storage and on Longhorn.
func TestRequestsBounded(t *testing.T) {
	f := newFixture(t)
	s0, d0, _ := f.requests(t)
	f.addNamespaces(t, 100)
	s1, d1, paths := f.requests(t)
	t.Logf("API requests: status %d, doctor %d (before and after adding 100 namespaces)", s1, d1)
	if s0 != s1 || d0 != d1 {
		t.Fatalf("requests grew with the namespaces: status %d → %d, doctor %d → %d", s0, s1, d0, d1)
	}
	if s1 > maxStatusRequests || d1 > maxDoctorRequests {
		t.Errorf("status made %d requests (at most %d), doctor %d (at most %d); status asked for:\n%s",
			s1, maxStatusRequests, d1, maxDoctorRequests, strings.Join(paths, "\n"))
	}

	f.setRecord(t, cluster.StorageLonghorn)
	t.Cleanup(func() { f.setRecord(t, cluster.StorageLocal) })
	f.longhorn(t)
	s2, d2, paths := f.requests(t)
	t.Logf("API requests on Longhorn: status %d, doctor %d", s2, d2)
	if s2 > maxStatusRequests || d2 > maxDoctorRequests {
		t.Errorf("on Longhorn, status made %d requests (at most %d), doctor %d (at most %d); status asked for:\n%s",
			s2, maxStatusRequests, d2, maxDoctorRequests, strings.Join(paths, "\n"))
	}
}

// BenchmarkStatus measures status and doctor on a cluster with 500 namespaces, each with a
// claim and a local volume: wall time per run, and API requests per run.
func BenchmarkStatus(b *testing.B) {
	f := newFixture(b)
	f.addNamespaces(b, 500)
	ctx := context.Background()
	c, l := testenv.CountingClients(b, f.env.Config)
	o := &Options{Out: &bytes.Buffer{}, Kube: func() (*kube.Clients, error) { return c, nil }, KipVersion: recordKip}
	b.Run("status", func(b *testing.B) {
		l.Take()
		for b.Loop() {
			if _, err := Collect(ctx, o); err != nil {
				b.Fatal(err)
			}
		}
		n, _ := l.Take()
		b.ReportMetric(float64(n)/float64(b.N), "requests/op")
	})
	b.Run("doctor", func(b *testing.B) {
		l.Take()
		for b.Loop() {
			Diagnose(ctx, o)
		}
		n, _ := l.Take()
		b.ReportMetric(float64(n)/float64(b.N), "requests/op")
	})
}

// TestStrandedService: a service whose data claim names a volume that does not exist is listed
// as stranded, with a warning; its claim is read from one list of the cluster's claims.
func TestStrandedService(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ref := service.Ref{Project: "strand", Environment: "prod", Name: "queue"}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ref.Namespace(), Labels: map[string]string{service.ProjectLabel: ref.Project}}}
	if _, err := f.c.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Other tests of this environment expect no stranded service: the cleanup waits until the
	// namespace controller has removed the namespace and what it held.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := f.c.Kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
			return
		}
		if err := kube.Poll(ctx, time.Minute, "namespace "+ns.Name+" gone", func(ctx context.Context) (bool, string, error) {
			_, err := f.c.Kube.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			return false, "terminating", err
		}); err != nil {
			t.Error(err)
		}
	})
	svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace()}, "spec": map[string]any{"type": "redis", "storage": "1Gi"}}}
	if _, err := f.c.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A claim the PV controller bound (its annotation) to a volume that is gone, as after someone
	// deleted the PersistentVolume: the controller turns it Lost, and the test waits for that
	// rather than racing it.
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-queue-0", Namespace: ref.Namespace(),
		Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: new(string), VolumeName: "pv-gone",
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := f.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Poll(ctx, time.Minute, "claim data-queue-0 Lost", func(ctx context.Context) (bool, string, error) {
		c, err := f.c.Kube.CoreV1().PersistentVolumeClaims(ref.Namespace()).Get(ctx, "data-queue-0", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return c.Status.Phase == corev1.ClaimLost, string(c.Status.Phase), nil
	}); err != nil {
		t.Fatal(err)
	}
	r, err := Collect(ctx, f.options(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(r.Stranded, func(s Stranded) bool { return s.Service == ref })
	if i < 0 || r.Stranded[i].Claim != "data-queue-0" || !strings.Contains(r.Stranded[i].Reason, "pv-gone") {
		t.Fatalf("stranded services: %+v", r.Stranded)
	}
	if !slices.ContainsFunc(r.Warnings, func(w string) bool { return strings.Contains(w, "service queue in strand-prod is stranded") }) {
		t.Errorf("warnings %q", r.Warnings)
	}
	if len(r.CopiesUnset) != 0 {
		t.Errorf("copies unset listed on local storage: %+v", r.CopiesUnset)
	}

	// On Longhorn, the service whose copies are unset is listed with the command that records
	// them; one whose copies are recorded is not.
	recorded := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kipper.run/v1alpha1", "kind": "Service",
		"metadata": map[string]any{"name": "cache", "namespace": ref.Namespace()}, "spec": map[string]any{"type": "redis", "copies": int64(1)}}}
	if _, err := f.c.Dynamic.Resource(service.ServicesGVR).Namespace(ref.Namespace()).Create(ctx, recorded, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.setRecord(t, cluster.StorageLonghorn)
	t.Cleanup(func() { f.setRecord(t, cluster.StorageLocal) })
	if r, err = Collect(ctx, f.options(&bytes.Buffer{})); err != nil {
		t.Fatal(err)
	}
	want := CopiesUnset{Service: ref, Kept: 1, Record: "kip service update queue --project strand --environment prod --copies 1"}
	if len(r.CopiesUnset) != 1 || r.CopiesUnset[0] != want {
		t.Errorf("copies unset %+v, want %+v", r.CopiesUnset, want)
	}
}
