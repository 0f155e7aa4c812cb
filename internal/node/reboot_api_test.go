package node

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// TestRebootRefusals runs kip node reboot against the real API server (kwok's Nodes, Longhorn's
// CRDs) for what it refuses before it changes anything, in the order it checks: the server, a
// worker kip did not record, a name no node has, a worker still joining, a fenced worker, one
// holding the only current copy of a Longhorn volume (a copy that failed elsewhere does not
// count), a cluster without backups unless --no-backup, and a worker SSH does not reach.
func TestRebootRefusals(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env.AddNode(t, "rb-srv", testenv.NodeOptions{Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}})
	env.AddNode(t, "rb-stray", testenv.NodeOptions{})
	env.AddNode(t, "rb-joining", testenv.NodeOptions{})
	env.AddNode(t, "rb-fenced", testenv.NodeOptions{Taints: []corev1.Taint{{Key: cluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}}})
	env.AddNode(t, "rb-only", testenv.NodeOptions{})
	env.AddNode(t, "rb-two", testenv.NodeOptions{})
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server, rec.Backups = "small", cluster.StorageLonghorn, "203.0.113.10", cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	workers := map[string]Worker{
		"rb-joining": {Host: "203.0.113.41", State: WorkerJoining},
		"rb-fenced":  {Host: "203.0.113.42", State: WorkerReady},
		"rb-only":    {Host: "203.0.113.43", State: WorkerReady},
		"rb-two":     {Host: "203.0.113.44", State: WorkerReady},
	}
	if _, err := UpdateNodes(ctx, cl.Dynamic, func(n *Nodes) error {
		for name, w := range workers {
			n.Workers[name] = w
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := UpdateNodes(ctx, cl.Dynamic, func(n *Nodes) error {
			for name := range workers {
				delete(n.Workers, name)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	})
	lhNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhornSpace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, lhNS, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// rb-only holds the one copy of rb-vol1 and, beside a copy on the server that failed, of
	// rb-vol2; rb-two holds one of rb-vol3's two current copies.
	replica(t, cl, "rb-vol1-r1", "rb-vol1", "rb-only", true)
	replica(t, cl, "rb-vol2-r1", "rb-vol2", "rb-only", true)
	replica(t, cl, "rb-vol2-r2", "rb-vol2", "rb-srv", false)
	replica(t, cl, "rb-vol3-r1", "rb-vol3", "rb-two", true)
	replica(t, cl, "rb-vol3-r2", "rb-vol3", "rb-srv", true)

	io := &cli.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	for _, tt := range []struct {
		worker   string
		noBackup bool
		want     string
	}{
		{"rb-srv", false, "rb-srv is the cluster's server: kip node reboot reboots workers"},
		{"rb-stray", false, "node rb-stray is a worker kip did not record"},
		{"rb-none", false, "the cluster has no worker rb-none: kip node list shows its nodes"},
		{"rb-joining", false, "worker rb-joining has not finished joining: run kip node add 203.0.113.41 again"},
		{"rb-fenced", false, "worker rb-fenced is fenced (out of service)"},
		{"rb-only", false, "no node but rb-only holds a current copy of Longhorn volume rb-vol1, rb-vol2, so a reboot would leave its data unavailable"},
		{"rb-two", false, "this cluster has no backups, so nothing could restore what a failed reboot lost: pass --no-backup to reboot rb-two anyway"},
		{"rb-two", true, "a reboot runs over SSH, and kip cannot reach rb-two at 203.0.113.44"},
	} {
		err := Reboot(ctx, &RebootOptions{
			Worker: tt.worker, NoBackup: tt.noBackup,
			Env: Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(io), Prompter: cli.NewPrompter(io, true),
				Dial: func(context.Context, string) (*sshx.Client, error) {
					return nil, errors.New("no host is reached in this test")
				}},
		})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("reboot %s = %v, want %q", tt.worker, err, tt.want)
		}
	}
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, "rb-two", metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable {
		t.Errorf("the refusals cordoned rb-two: %v", err)
	}
	if p, err := workflow.ListUnfinished(ctx, cl.Dynamic, kube.ClusterRecords()); err != nil || len(p) != 0 {
		t.Errorf("the refusals left progress records: %+v (%v)", p, err)
	}
}

// replica creates a Longhorn replica of volume on node, current (healthy since it last failed)
// or failed.
func replica(t *testing.T, cl *kube.Clients, name, volume, node string, current bool) {
	t.Helper()
	api := cl.Longhorn.LonghornV1beta2().Replicas(longhornSpace)
	r := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhornSpace,
		Labels: map[string]string{"longhornvolume": volume, "longhornnode": node}}}
	r.Spec.VolumeName, r.Spec.NodeID, r.Spec.Active, r.Spec.DataEngine = volume, node, true, "v1"
	r.Spec.HealthyAt, r.Spec.LastHealthyAt = "2026-12-01T10:00:00Z", "2026-12-01T10:00:00Z"
	if !current {
		r.Spec.FailedAt, r.Spec.LastFailedAt = "2026-12-01T11:00:00Z", "2026-12-01T11:00:00Z"
	}
	if _, err := api.Create(t.Context(), r, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}
