package workflow_test

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const (
	demoLabel   = "kip-test"
	appliesName = "applies"
	testHolder  = "kip demo by tester@host, pid 1"
	kipVersion  = "v0.0.0-test"
	// leaseDuration is half a minute: a lock left by a killed run on this machine is taken over at
	// once (its process is gone), and a renewal may take seconds on a loaded machine (each waits
	// a sixth of the lease, and the lock is lost after half of it without one).
	leaseDuration = 30 * time.Second
)

type demoIntent struct {
	Replicas int `json:"replicas"`
}

// demo is a five-step workflow whose steps create and change ConfigMaps in one namespace. Every
// Apply counts itself in the ConfigMap "applies" before its change, so a test sees a step that
// was applied twice.
type demo struct {
	kube   kubernetes.Interface
	ns     string
	intent demoIntent
	// hook, when set, is called in the test's own process at "apply:<step>" (Apply started, after
	// the intent record) and "applied:<step>" (Apply's change made, before the progress record).
	// TestKilledRunResumes kills at these boundaries with the runner's own fault points instead.
	hook func(point string)
	// fail makes a step's Apply return an error before it changes anything.
	fail map[string]error
	// noop makes a step's Apply change nothing, so that its check still fails afterwards.
	noop map[string]bool
	// extra steps run after the five.
	extra []workflow.Step
}

func newDemo(client kubernetes.Interface, ns string) *demo {
	return &demo{
		kube:   client,
		ns:     ns,
		intent: demoIntent{Replicas: 3},
		fail:   map[string]error{},
		noop:   map[string]bool{},
	}
}

var demoSteps = []string{"create-config", "create-app", "scale-app", "link-config", "mark-ready"}

func (d *demo) workflow() *workflow.Workflow {
	replicas := func() string { return strconv.Itoa(d.intent.Replicas) }
	return &workflow.Workflow{
		Name:    "demo",
		Records: kube.ConfigMapRef(d.ns, "kipper-records"),
		Intent:  &d.intent,
		Steps: append([]workflow.Step{
			d.step("create-config", "Create ConfigMap config", "Created ConfigMap config", "ConfigMap config already exists",
				d.exists("config"),
				func() []string { return []string{"create ConfigMap config with color=blue"} },
				func(ctx context.Context) error { return d.create(ctx, "config", map[string]string{"color": "blue"}) }),
			d.step("create-app", "Create ConfigMap app", "Created ConfigMap app", "ConfigMap app already exists",
				d.exists("app"),
				func() []string { return []string{"create ConfigMap app with replicas=1"} },
				func(ctx context.Context) error { return d.create(ctx, "app", map[string]string{"replicas": "1"}) }),
			d.step("scale-app", "Scale app", "Scaled app", "app already scaled",
				func(ctx context.Context) (bool, error) { return d.has(ctx, "app", "replicas", replicas()) },
				func() []string { return []string{"set replicas of ConfigMap app to " + replicas()} },
				func(ctx context.Context) error { return d.set(ctx, "app", "replicas", replicas()) }),
			d.step("link-config", "Link config to app", "Linked config to app", "config already linked to app",
				func(ctx context.Context) (bool, error) { return d.has(ctx, "config", "app", "app") },
				func() []string { return []string{"set app=app in ConfigMap config"} },
				func(ctx context.Context) error { return d.set(ctx, "config", "app", "app") }),
			d.step("mark-ready", "Mark the demo ready", "Marked the demo ready", "demo already marked ready",
				d.exists("ready"),
				nil,
				func(ctx context.Context) error { return d.create(ctx, "ready", map[string]string{"ready": "true"}) }),
		}, d.extra...),
	}
}

func (d *demo) at(point string) {
	if d.hook != nil {
		d.hook(point)
	}
}

func (d *demo) step(name, title, done, already string, check func(context.Context) (bool, error), plan func() []string, change func(context.Context) error) workflow.Step {
	s := workflow.Step{
		Name: name, Title: title, Done: done, Already: already,
		Check: check,
		Apply: func(ctx context.Context) error {
			d.at("apply:" + name)
			if err := d.fail[name]; err != nil {
				return err
			}
			if d.noop[name] {
				return nil
			}
			if err := d.count(ctx, name); err != nil {
				return err
			}
			if err := change(ctx); err != nil {
				return err
			}
			d.at("applied:" + name)
			return nil
		},
	}
	if plan != nil {
		s.Plan = func(context.Context) ([]string, error) { return plan(), nil }
	}
	return s
}

func (d *demo) configMaps() corev1client.ConfigMapInterface {
	return d.kube.CoreV1().ConfigMaps(d.ns)
}

func (d *demo) exists(name string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		_, err := d.configMaps().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
}

func (d *demo) has(ctx context.Context, name, key, value string) (bool, error) {
	cm, err := d.configMaps().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return cm.Data[key] == value, nil
}

func (d *demo) create(ctx context.Context, name string, data map[string]string) error {
	_, err := d.configMaps().Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{demoLabel: "demo"}},
		Data:       data,
	}, metav1.CreateOptions{})
	return err
}

func (d *demo) set(ctx context.Context, name, key, value string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := d.configMaps().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[key] = value
		_, err = d.configMaps().Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// count adds one to step's count of applies.
func (d *demo) count(ctx context.Context, step string) error {
	retriable := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	return retry.OnError(retry.DefaultRetry, retriable, func() error {
		cm, err := d.configMaps().Get(ctx, appliesName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return d.create(ctx, appliesName, map[string]string{step: "1"})
		}
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(cm.Data[step])
		cm.Data[step] = strconv.Itoa(n + 1)
		_, err = d.configMaps().Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// state returns the data of every ConfigMap the demo made, by name.
func state(t *testing.T, client kubernetes.Interface, ns string) map[string]map[string]string {
	t.Helper()
	list, err := client.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{LabelSelector: demoLabel})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, cm := range list.Items {
		got[cm.Name] = cm.Data
	}
	return got
}

// progress reads the demo's progress record in ns.
func progress(t *testing.T, dyn dynamic.Interface, ns string) (workflow.Progress, bool) {
	t.Helper()
	p, found, err := kube.ReadRecord[workflow.Progress](t.Context(), dyn, kube.ConfigMapRef(ns, "kipper-records"), "op-demo", 1)
	if err != nil {
		t.Fatal(err)
	}
	return p, found
}

// clients returns the clients for cfg.
func clients(t testing.TB, cfg *rest.Config) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client, dyn
}

// newRunner runs workflows as holder with the real printer writing to out (no terminal, no
// colour), holding a short-lived lock in ns.
func newRunner(client kubernetes.Interface, dyn dynamic.Interface, ns, holder string, out io.Writer) *workflow.Runner {
	return &workflow.Runner{
		Dynamic:    dyn,
		Lock:       workflow.ClusterLock(client, kube.LockOptions{Namespace: ns, LeaseDuration: leaseDuration}),
		Holder:     holder,
		KipVersion: kipVersion,
		Report:     cli.NewPrinter(&cli.IOStreams{ErrOut: out, Getenv: func(string) string { return "" }}),
	}
}

var (
	durations = regexp.MustCompile(`\((\d+ms|\d+(\.\d)?s|\d+m\d\ds)\)`)
	times     = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+`)
)

// golden compares printed output, with durations and times blanked, to testdata/<name>.golden.
func golden(t *testing.T, name, out string) {
	t.Helper()
	out = times.ReplaceAllString(durations.ReplaceAllString(out, "(<duration>)"), "<time>")
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(want, []byte(out)) {
		t.Errorf("output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, out, want)
	}
}
