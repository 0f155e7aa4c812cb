package node

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// TestRebootRefusals runs kip node reboot against the real API server (kwok's Nodes, Longhorn's
// CRDs) for what it refuses before it changes anything, in the order it checks: the server, a
// worker kip did not record, a name no node has, a worker still joining, a fenced worker, one
// holding the only current copy of a Longhorn volume (a copy that failed elsewhere does not
// count) when the server has no room to take it, or whose only copy failed, a cluster without
// backups unless --no-backup, and a worker SSH does not reach (also once the server has room).
func TestRebootRefusals(t *testing.T) {
	env, cl := apiCluster(t, "rb-srv")
	ctx := context.Background()
	env.AddNode(t, "rb-stray", testenv.NodeOptions{})
	env.AddNode(t, "rb-joining", testenv.NodeOptions{})
	env.AddNode(t, "rb-fenced", fencedNode)
	env.AddNode(t, "rb-only", testenv.NodeOptions{})
	env.AddNode(t, "rb-stale", testenv.NodeOptions{})
	env.AddNode(t, "rb-two", testenv.NodeOptions{})
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server, rec.Backups = "small", cluster.StorageLonghorn, "203.0.113.10", cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	workers := map[string]cluster.Worker{
		"rb-joining": {Host: "203.0.113.41", State: cluster.WorkerJoining},
		"rb-fenced":  {Host: "203.0.113.42", State: cluster.WorkerReady},
		"rb-only":    {Host: "203.0.113.43", State: cluster.WorkerReady},
		"rb-stale":   {Host: "203.0.113.45", State: cluster.WorkerReady},
		"rb-two":     {Host: "203.0.113.44", State: cluster.WorkerReady},
	}
	recordWorkers(t, cl, workers)
	lhNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, lhNS, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// rb-only holds the one copy of rb-vol1 and, beside a copy on the server that failed, of
	// rb-vol2 (6 GiB in all); rb-stale the one copy of rb-vol4, failed; rb-two one of rb-vol3's
	// two current copies. The server's Longhorn disk can take 4 GiB more.
	replica(t, cl, "rb-vol1-r1", "rb-vol1", "rb-only", true)
	replica(t, cl, "rb-vol2-r1", "rb-vol2", "rb-only", true)
	replica(t, cl, "rb-vol2-r2", "rb-vol2", "rb-srv", false)
	replica(t, cl, "rb-vol3-r1", "rb-vol3", "rb-two", true)
	replica(t, cl, "rb-vol3-r2", "rb-vol3", "rb-srv", true)
	replica(t, cl, "rb-vol4-r1", "rb-vol4", "rb-stale", false)
	longhornVolume(t, cl, "rb-vol1", 2<<30)
	longhornVolume(t, cl, "rb-vol2", 4<<30)
	setRoom := longhornNode(t, cl, "rb-srv", 4<<30)

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
		{"rb-only", false, "no node but rb-only holds a current copy of Longhorn volume rb-vol1, rb-vol2, so a reboot would leave its data unavailable until rb-only is back, " +
			"and the server has no room to take the copies (6.0 GiB): Longhorn's roomiest disk on node rb-srv can take 4.0 GiB more"},
		{"rb-stale", false, "no node holds a current copy of Longhorn volume rb-vol4, not even rb-stale, so kip cannot move one to the server before the reboot"},
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
	// With room on the server, the copies no longer stop the reboot: it goes on to reach the
	// worker.
	setRoom(10 << 30)
	err := Reboot(ctx, &RebootOptions{Worker: "rb-only", NoBackup: true,
		Env: Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(io), Prompter: cli.NewPrompter(io, true),
			Dial: func(context.Context, string) (*sshx.Client, error) {
				return nil, errors.New("no host is reached in this test")
			}}})
	if err == nil || !strings.Contains(err.Error(), "a reboot runs over SSH, and kip cannot reach rb-only") {
		t.Errorf("reboot rb-only with room on the server = %v", err)
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
	api := cl.Longhorn.LonghornV1beta2().Replicas(longhorn.Namespace)
	r := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhorn.Namespace,
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

// TestRebootMovesOnlyCopies runs the reboot's copies and unpin steps against the real API server,
// with the test playing Longhorn's part (it cannot run here): once the worker's Node is cordoned,
// each replica there that is its volume's last healthy one is rebuilt on the roomiest Longhorn
// node whose tags hold the volume's node selector, then deleted, as Longhorn's node controller
// (under the pinned node-drain-policy block-for-eviction-if-contains-last-replica), scheduler and
// volume controller do. Another worker has more room than the server, yet the copies go to the
// server: the step tags it and restricts the volumes to the tag. A volume with a current copy on
// the server as well keeps its copy on the worker. The unpin step then lifts the restriction.
func TestRebootMovesOnlyCopies(t *testing.T) {
	_, cl := apiCluster(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lhNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}}
	if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, lhNS, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	nodes := cl.Kube.CoreV1().Nodes()
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "mv-worker"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mv-srv", Labels: map[string]string{"node-role.kubernetes.io/control-plane": "true"}}},
	} {
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nodes.Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	}
	longhornNode(t, cl, "mv-srv", 10<<30)
	longhornNode(t, cl, "mv-w2", 50<<30)
	for _, v := range []string{"mv-vol1", "mv-vol2", "mv-other"} {
		longhornVolume(t, cl, v, 1<<30)
	}
	// mv-vol2 keeps two copies: its other one's node is gone.
	if _, err := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace).Patch(ctx, "mv-vol2", types.MergePatchType, []byte(`{"spec":{"numberOfReplicas":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	replica(t, cl, "mv-vol1-r1", "mv-vol1", "mv-worker", true)
	replica(t, cl, "mv-vol2-r1", "mv-vol2", "mv-worker", true)
	replica(t, cl, "mv-other-r1", "mv-other", "mv-worker", true)
	replica(t, cl, "mv-other-r2", "mv-other", "mv-srv", true)
	lh := cl.Longhorn.LonghornV1beta2()
	replicas := lh.Replicas(longhorn.Namespace)

	// Longhorn's part: on the cordoned worker, each last healthy replica is rebuilt on the
	// roomiest node the volume's selector allows, then deleted.
	played := make(chan struct{})
	go func() {
		defer close(played)
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			n, err := nodes.Get(ctx, "mv-worker", metav1.GetOptions{})
			if err != nil || !n.Spec.Unschedulable {
				continue
			}
			list, err := replicas.List(ctx, metav1.ListOptions{})
			if err != nil {
				return
			}
			for _, v := range longhorn.OnlyReplicasOn(list.Items, "mv-worker") {
				vol, err := lh.Volumes(longhorn.Namespace).Get(ctx, v, metav1.GetOptions{})
				if err != nil {
					return
				}
				to := ""
				for _, name := range []string{"mv-w2", "mv-srv"} { // the roomiest first
					ln, err := lh.Nodes(longhorn.Namespace).Get(ctx, name, metav1.GetOptions{})
					if err == nil && !slices.ContainsFunc(vol.Spec.NodeSelector, func(tag string) bool { return !slices.Contains(ln.Spec.Tags, tag) }) {
						to = name
						break
					}
				}
				rebuilt := &longhornv1beta2.Replica{ObjectMeta: metav1.ObjectMeta{Name: v + "-r2", Namespace: longhorn.Namespace,
					Labels: map[string]string{"longhornvolume": v, "longhornnode": to}}}
				rebuilt.Spec.VolumeName, rebuilt.Spec.NodeID, rebuilt.Spec.Active, rebuilt.Spec.DataEngine = v, to, true, "v1"
				rebuilt.Spec.HealthyAt, rebuilt.Spec.LastHealthyAt = "2026-12-05T10:00:00Z", "2026-12-05T10:00:00Z"
				if _, err := replicas.Create(ctx, rebuilt, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return
				}
				if err := replicas.Delete(ctx, v+"-r1", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return
				}
			}
		}
	}()
	t.Cleanup(func() {
		for _, v := range []string{"mv-vol1", "mv-vol2"} {
			_ = replicas.Delete(context.Background(), v+"-r2", metav1.DeleteOptions{})
		}
	})

	io := &cli.IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	r := &rebooter{o: &RebootOptions{Worker: "mv-worker"}, p: cli.NewPrinter(io), cl: cl, moves: []string{"mv-vol1", "mv-vol2"}}
	copies, unpin := r.copiesStep(), r.unpinStep()
	if done, err := copies.Check(ctx); err != nil || done {
		t.Fatalf("copies step before it ran: done %v, %v", done, err)
	}
	if done, err := unpin.Check(ctx); err != nil || !done {
		t.Fatalf("unpin step before the copies step: done %v, %v", done, err)
	}
	if err := copies.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := copies.Check(ctx); err != nil || !done {
		t.Fatalf("copies step after it ran: done %v, %v", done, err)
	}
	if n, err := nodes.Get(ctx, "mv-worker", metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
		t.Errorf("the worker after the copies step is not cordoned: %v", err)
	}
	if n, err := lh.Nodes(longhorn.Namespace).Get(ctx, "mv-srv", metav1.GetOptions{}); err != nil || !slices.Contains(n.Spec.Tags, longhorn.ServerTag) {
		t.Errorf("the server's Longhorn node is not tagged %s: %v", longhorn.ServerTag, err)
	}
	if done, err := unpin.Check(ctx); err != nil || done {
		t.Fatalf("unpin step after the copies step: done %v, %v", done, err)
	}
	if err := unpin.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err := unpin.Check(ctx); err != nil || !done {
		t.Fatalf("unpin step after it ran: done %v, %v", done, err)
	}
	// A volume of one copy stays pinned to the server, where single-copy volumes live.
	for v, want := range map[string][]string{"mv-vol1": {longhorn.ServerTag}, "mv-vol2": nil, "mv-other": nil} {
		vol, err := lh.Volumes(longhorn.Namespace).Get(ctx, v, metav1.GetOptions{})
		if err != nil || !slices.Equal(vol.Spec.NodeSelector, want) || vol.Annotations[rebootPinnedAnnotation] != "" {
			t.Errorf("volume %s after the unpin step: %v %v %v, want selector %v", v, vol.Spec.NodeSelector, vol.Annotations, err, want)
		}
	}
	cancel()
	<-played
	list, err := replicas.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	where := map[string][]string{}
	for _, rep := range list.Items {
		if strings.HasPrefix(rep.Spec.VolumeName, "mv-") {
			where[rep.Spec.VolumeName] = append(where[rep.Spec.VolumeName], rep.Spec.NodeID)
		}
	}
	for v, want := range map[string][]string{"mv-vol1": {"mv-srv"}, "mv-vol2": {"mv-srv"}, "mv-other": {"mv-srv", "mv-worker"}} {
		slices.Sort(where[v])
		if !slices.Equal(where[v], want) {
			t.Errorf("the copies of %s are on %v, want on %v", v, where[v], want)
		}
	}
}

// longhornVolume creates Longhorn's Volume of size.
func longhornVolume(t *testing.T, cl *kube.Clients, name string, size int64) {
	t.Helper()
	api := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace)
	v := &longhornv1beta2.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhorn.Namespace}, Spec: testenv.LonghornVolumeSpec(size, 1)}
	if _, err := api.Create(t.Context(), v, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// longhornNode creates Longhorn's Node name with one ready disk that can take room more, and
// returns what sets that room again.
func longhornNode(t *testing.T, cl *kube.Clients, name string, room int64) func(int64) {
	t.Helper()
	api := cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace)
	const gib = int64(1 << 30)
	n := &longhornv1beta2.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: longhorn.Namespace}}
	n.Spec.AllowScheduling = true
	n.Spec.Disks = map[string]longhornv1beta2.DiskSpec{"default": {Type: longhornv1beta2.DiskTypeFilesystem, Path: "/var/lib/longhorn", AllowScheduling: true}}
	if _, err := api.Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	set := func(room int64) {
		t.Helper()
		n, err := api.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// With Longhorn's default over-provisioning (100%) and minimal available (25%), an empty
		// 100 GiB disk takes what is not scheduled yet, up to 75 GiB.
		n.Status.DiskStatus = map[string]*longhornv1beta2.DiskStatus{"default": {StorageMaximum: 100 * gib, StorageAvailable: 100 * gib,
			StorageScheduled: 100*gib - room, Conditions: []longhornv1beta2.Condition{{Type: longhornv1beta2.DiskConditionTypeReady, Status: longhornv1beta2.ConditionStatusTrue}}}}
		if _, err := api.UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set(room)
	return set
}
