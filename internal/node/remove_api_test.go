package node

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// TestRemoveRefusals runs kip node remove against the real API server (kwok's Nodes) for what
// it refuses before it connects anywhere: the server, a worker kip did not record, a name no
// node has, a fenced worker without --force, and --force on a worker no fence holds, NotReady
// (its host may only be cut off: TestRemoveForceUnfencedNotReady) or Ready. Each refusal leaves
// the record and the Nodes as they were.
func TestRemoveRefusals(t *testing.T) {
	env, cl := apiCluster(t, "rm-srv")
	ctx := context.Background()
	env.AddNode(t, "rm-stray", testenv.NodeOptions{})
	env.AddNode(t, "rm-fenced", fencedNode)
	env.AddNode(t, "rm-up", testenv.NodeOptions{})
	deadNode(t, cl, "rm-lost")
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server = "small", cluster.StorageLonghorn, "203.0.113.10"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	recordWorkers(t, cl, map[string]cluster.Worker{"rm-fenced": {Host: "203.0.113.31", State: cluster.WorkerReady},
		"rm-up": {Host: "203.0.113.32", State: cluster.WorkerReady}, "rm-lost": {Host: "203.0.113.33", State: cluster.WorkerReady}})
	io := &cli.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	for _, tt := range []struct {
		worker string
		force  bool
		want   string
	}{
		{"rm-srv", false, "rm-srv is the cluster's server: kip node remove removes workers"},
		{"rm-stray", false, "node rm-stray is a worker kip did not record"},
		{"rm-none", false, "the cluster has no worker rm-none: kip node list shows its nodes"},
		{"rm-fenced", false, "worker rm-fenced is fenced (out of service)"},
		{"rm-lost", true, "worker rm-lost is NotReady and no fence holds it, and --force deletes its node, after which Kubernetes force-deletes its pods and lets other nodes attach its volumes " +
			"while its host may still run and write them: fence it first with kip node fence rm-lost"},
		{"rm-up", true, "worker rm-up is Ready, so its host runs, and --force deregisters only a worker a fence holds: run kip node remove rm-up without --force"},
	} {
		err := Remove(ctx, &RemoveOptions{
			Worker: tt.worker, Force: tt.force, Env: Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(io), Prompter: cli.NewPrompter(io, true),
				Dial: func(context.Context, string) (*sshx.Client, error) {
					return nil, errors.New("no host is reached before these refusals")
				}},
		})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("remove %s = %v, want %q", tt.worker, err, tt.want)
		}
		if tt.worker == "rm-fenced" && !strings.Contains(err.Error(), "kip node remove rm-fenced --force") {
			t.Errorf("remove of a fenced worker does not name --force: %v", err)
		}
	}
	if n, err := cluster.ReadNodes(ctx, cl.Dynamic); err != nil || n.Workers["rm-fenced"].State != cluster.WorkerReady || n.Workers["rm-lost"].State != cluster.WorkerReady {
		t.Errorf("the refusals changed the record: %+v (%v)", n, err)
	}
	for _, name := range []string{"rm-lost", "rm-up"} {
		if _, err := cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("node %s after the refusal: %v", name, err)
		}
	}
}

// TestRemoveForceUnfencedNotReady: kip node remove --force, answered yes, on a worker that
// stopped reporting and that no fence holds (its host may only be cut off from the server and
// still write its volumes) is refused, naming kip node fence, before anything changes: its Node,
// the pod that runs there and the volume attached there stay, as do its record and the progress
// records. Deleting the Node would have had Kubernetes force-delete the pod and attach its volume
// elsewhere. The lab proves it with a worker cut off from the server's API (TestNodeAdd's second
// worker).
func TestRemoveForceUnfencedNotReady(t *testing.T) {
	_, cl := apiCluster(t, "ru-srv")
	ctx := context.Background()
	deadNode(t, cl, "ru-lost")
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server = "small", cluster.StorageLonghorn, "203.0.113.10"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	recordWorkers(t, cl, map[string]cluster.Worker{"ru-lost": {Host: "203.0.113.41", State: cluster.WorkerReady}})
	pod(t, cl, "default", "ru-app", "ru-lost", nil, "")
	att := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "ru-att"}, Spec: storagev1.VolumeAttachmentSpec{
		Attacher: longhorn.Driver, NodeName: "ru-lost", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pvc-ru")}}}
	if _, err := cl.Kube.StorageV1().VolumeAttachments().Create(ctx, att, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Kube.StorageV1().VolumeAttachments().Delete(context.Background(), att.Name, metav1.DeleteOptions{})
	})
	io := &cli.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	err := Remove(ctx, &RemoveOptions{Worker: "ru-lost", Force: true, Env: Env{Kube: func() (*kube.Clients, error) { return cl, nil },
		Printer: cli.NewPrinter(io), Prompter: cli.NewPrompter(io, true), // --yes
		Dial: func(context.Context, string) (*sshx.Client, error) {
			return nil, errors.New("dial tcp 203.0.113.41:22: connect: no route to host")
		}}})
	if want := "worker ru-lost is NotReady and no fence holds it"; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "fence it first with kip node fence ru-lost") {
		t.Fatalf("remove --force of an unfenced NotReady worker = %v, want %q and the fence named", err, want)
	}
	if _, err := cl.Kube.CoreV1().Nodes().Get(ctx, "ru-lost", metav1.GetOptions{}); err != nil {
		t.Errorf("the worker's Node after the refusal: %v", err)
	}
	if p, err := cl.Kube.CoreV1().Pods("default").Get(ctx, "ru-app", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the worker's pod after the refusal: %v", err)
	}
	if a, err := cl.Kube.StorageV1().VolumeAttachments().Get(ctx, att.Name, metav1.GetOptions{}); err != nil || a.DeletionTimestamp != nil {
		t.Errorf("the volume attached on the worker after the refusal: %v", err)
	}
	if n, err := cluster.ReadNodes(ctx, cl.Dynamic); err != nil || n.Workers["ru-lost"].State != cluster.WorkerReady || n.Workers["ru-lost"].Fence != nil {
		t.Errorf("the refusal changed the record: %+v (%v)", n, err)
	}
	if p, err := workflow.ListUnfinished(ctx, cl.Dynamic, kube.ClusterRecords()); err != nil || len(p) != 0 {
		t.Errorf("the refusal left progress records: %+v (%v)", p, err)
	}
}

// TestDrainWaitsForDetach runs the drain step of kip node remove and reboot against the real API
// server: a node without pods whose volume is still attached is not drained; once Kubernetes'
// VolumeAttachment is gone, the step's wait ends and the node counts as drained.
func TestDrainWaitsForDetach(t *testing.T) {
	env, cl := apiCluster(t, "")
	ctx := t.Context()
	env.AddNode(t, "dr-w", testenv.NodeOptions{})
	attach(t, cl, "pv-dr", "dr-w")
	if err := cordon(ctx, cl, "dr-w", true); err != nil {
		t.Fatal(err)
	}
	step := drainStep(cl, "dr-w")
	if done, err := step.Check(ctx); err != nil || done {
		t.Errorf("drain check with a volume attached: %v, %v; want not drained", done, err)
	}
	done := make(chan error, 1)
	go func() { done <- step.Apply(ctx) }()
	if err := cl.Kube.StorageV1().VolumeAttachments().Delete(ctx, "va-pv-dr", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("drain once the volume detached: %v", err)
	}
	if ok, err := step.Check(ctx); err != nil || !ok {
		t.Errorf("drain check with no volume attached: %v, %v; want drained", ok, err)
	}
}
