package node

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/test/sshd"
)

// TestFenceCutOff: a worker that stopped reporting but answers kip over SSH, and does not reach
// the server's API, is cut off from the server, and what Longhorn says of the copies of the
// volumes whose engine ran there is only what it reported before: a copy elsewhere that Longhorn
// calls current is not known to be. The worker is this machine, reached through a real sshd (its
// hostname the node's name); the server's recorded address (TEST-NET-1) answers nothing. The
// fence's examination (which reads, and changes nothing: no fence step runs on this machine)
// finds it cut off and keeps the service whose engine ran there stopped unless older data is
// accepted, though Longhorn calls its copy on the server current. Then, with
// the fence recorded as it would be, kip service start refuses the first without
// --accept-stale-data, naming the reason in each copy's line, and kip status calls it stranded
// with no copy known to be current.
func TestFenceCutOff(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		t.Fatalf("this machine's hostname %q cannot name a node: %v", name, errs)
	}
	_, cl := apiCluster(t, "co-srv")
	srv := sshd.Start(t)
	ctx := t.Context()
	deadNode(t, cl, name)
	t.Cleanup(func() {
		_ = cl.Kube.CoreV1().ConfigMaps(kube.RecordsNamespace).Delete(context.Background(), kube.RecordsConfigMap, metav1.DeleteOptions{})
	})
	unreachable := netip.MustParseAddr("192.0.2.1")
	if _, err := cluster.UpdateRecord(ctx, cl.Dynamic, func(rec *cluster.Record, _ bool) error {
		rec.Profile, rec.Storage, rec.Server, rec.Backups = "small", cluster.StorageLonghorn, unreachable.String(), cluster.BackupsNone
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.UpdateNodes(ctx, cl.Dynamic, func(n *cluster.Nodes) error {
		n.Workers[name] = cluster.Worker{Host: srv.Host, State: cluster.WorkerReady,
			Path: cluster.Path{Mode: cluster.ModePrivate, Server: unreachable, Node: netip.MustParseAddr(fenceKubelet)}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: longhorn.Namespace}},
		{ObjectMeta: metav1.ObjectMeta{Name: "co-prod", Labels: map[string]string{service.ProjectLabel: "co"}}},
	} {
		if _, err := cl.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// here's engine ran on the worker; it has a copy there and on the server, which Longhorn
	// calls current. Another volume's engine runs on the server.
	engines := map[string]string{"data-here-0": name, "data-away-0": "co-srv"}
	vols := map[string]string{}
	for claim, engine := range engines {
		pv := longhornClaim(t, cl, "co-prod", claim)
		vols[claim] = pv
		replica(t, cl, pv+"-w", pv, name, true)
		replica(t, cl, pv+"-srv", pv, "co-srv", true)
		attach(t, cl, pv, engine)
		api := cl.Longhorn.LonghornV1beta2().Volumes(longhorn.Namespace)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			v, err := api.Get(ctx, pv, metav1.GetOptions{})
			if err != nil {
				return err
			}
			v.Status.State, v.Status.CurrentNodeID = longhornv1beta2.VolumeStateAttached, engine
			_, err = api.UpdateStatus(ctx, v, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	kipperProject(t, cl, "co", "prod")
	kipperService(t, cl, "co-prod", "here", "redis", false)

	out := &bytes.Buffer{}
	ios := &cli.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: out, Getenv: func(string) string { return "" }}
	knownHosts := t.TempDir() + "/known_hosts"
	var dialled []*sshx.Client
	t.Cleanup(func() {
		for _, c := range dialled {
			c.Close()
		}
	})
	e := Env{Kube: func() (*kube.Clients, error) { return cl, nil }, Printer: cli.NewPrinter(ios), Prompter: cli.NewPrompter(ios, false),
		CommandLine: "kip node fence " + name, KipVersion: "test", Debugf: func(string, ...any) {},
		Dial: func(ctx context.Context, host string) (*sshx.Client, error) {
			c, err := sshx.Dial(ctx, sshx.Config{Host: srv.Host, Port: srv.Port, User: sshd.User, KeyPath: srv.ClientKeyPath,
				KnownHostsPath: knownHosts, Timeout: 5 * time.Second, SSHConfigPath: "/dev/null", Notify: func(string) {}})
			if err == nil {
				dialled = append(dialled, c)
			}
			return c, err
		}}
	f := &fencer{o: &FenceOptions{Worker: name, Env: e}, p: e.Printer, intent: fenceIntent{Node: name}}
	if err := f.examine(ctx); err != nil {
		t.Fatalf("examine: %v\n%s", err, out)
	}
	if f.node == nil || !f.serverCut || !slices.Equal(f.intent.CutOff, []string{vols["data-here-0"]}) {
		t.Fatalf("the worker answering kip, cut off from the server: answered %v, cut %v, volumes %v\n%s", f.node != nil, f.serverCut, f.intent.CutOff, out)
	}
	if want := name + " answers kip but does not reach the server's API at 192.0.2.1:6443"; !strings.Contains(out.String(), want) {
		t.Errorf("the examination does not say %q:\n%s", want, out)
	}
	got := map[string]fencedService{}
	for _, s := range f.intent.Services {
		got[s.Name] = s
	}
	if s := got["here"]; s.Data != longhorn.DataStale || !s.stays() {
		t.Errorf("here, whose engine ran on the cut-off worker: %+v, want stale and stopped (no consent off a terminal)", s)
	}
	if len(got) != 1 {
		t.Errorf("services on the worker: %+v, want here alone", f.intent.Services)
	}

	// As the fence records it, here stopped by it.
	if _, err := cluster.UpdateNodes(ctx, cl.Dynamic, func(n *cluster.Nodes) error {
		w := n.Workers[name]
		w.Fence = &cluster.FenceRecord{At: time.Now().UTC(), CutOff: f.intent.CutOff,
			Stopped: []cluster.StoppedService{{Project: "co", Environment: "prod", Name: "here", Why: longhorn.DataStale}}}
		n.Workers[name] = w
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ref := service.Ref{Project: "co", Environment: "prod", Name: "here"}
	if err := service.SetFenceStop(ctx, cl.Dynamic, ref, name); err != nil {
		t.Fatal(err)
	}
	so := &service.ServiceOptions{Options: service.Options{Kube: e.Kube, Printer: e.Printer, Prompter: e.Prompter}}
	so.Ref = ref
	err = service.Start(ctx, so)
	if want := "run kip service start here --project co --environment prod --accept-stale-data"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("kip service start here: %v, want %q", err, want)
	}
	s, err := service.Get(ctx, cl.Dynamic, ref)
	if err != nil {
		t.Fatal(err)
	}
	_, copies, err := service.FencedData(ctx, cl, s, name, f.intent.CutOff)
	if err != nil {
		t.Fatal(err)
	}
	question := service.StaleQuestion(s, name, copies)
	if want := "on co-srv: not known to be current: its engine ran on " + name + ", which could not reach the server"; !strings.Contains(question, want) {
		t.Errorf("the question to accept older data does not say %q:\n%s", want, question)
	}
	if s.FenceStop != name || !s.Stopped {
		t.Errorf("here after the refused start: %+v", s)
	}
}
