// Package testenv runs a real Kubernetes control plane for kip's API tests.
//
// An Env is etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from the
// Kubernetes Go modules by tools/testenv.sh (make testenv), running as child processes on
// loopback ports with a certificate authority generated for the run. The real Longhorn, Velero
// and Kipper CRDs are installed and Established before Start returns. kwok (StartKwok, AddNode)
// stands in for kubelets: its fake Nodes report Ready, and Pods scheduled to them go Running and
// are deleted when asked, so Deployments roll out and namespaces finish deleting. Nothing runs
// containers.
//
// A package's tests share one environment:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := testenv.Get(t)      // started on first use, stopped when Main returns
//		ns := env.Namespace(t)     // isolate by namespace; deleted at cleanup
//		...
//	}
//
// When the binaries are missing the tests skip locally and fail under CI=true (see test/need).
package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/need"
)

// Env is a running control plane. Its fields are read-only.
type Env struct {
	// Config authenticates as an administrator (group system:masters).
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file (mode 0600) with the same credentials and the
	// cluster's CA embedded.
	KubeconfigPath string
	// Kube is a clientset built from Config.
	Kube kubernetes.Interface
	// Dir holds the environment's data, certificates, kubeconfigs and one log per process; it is
	// removed by Stop.
	Dir string
	// StartupTime is how long Start took: etcd, kube-apiserver, the CRDs Established,
	// controller-manager and scheduler healthy.
	StartupTime time.Duration
	// Timings breaks StartupTime down, for the log. The controller-manager and scheduler start
	// with the CRDs' creation; their times count from then.
	Timings string

	binDir string
	procs  []*process // in start order

	kwokMu  sync.Mutex
	kwok    *process
	kwokErr error

	nodesMu    sync.Mutex
	readyNodes map[string]bool // see ReadyNode

	done     chan struct{} // closed by Stop
	stopOnce sync.Once
}

// Binaries the environment runs, found in BinDir.
var (
	controlPlaneBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
	kwokBinary           = "kwok"
)

// missingError means the environment cannot exist on this machine: tests skip locally and fail
// under CI.
type missingError struct{ reason string }

func (e *missingError) Error() string { return e.reason }

// errPortTaken means a process could not bind the port chosen for it: Start tries again.
var errPortTaken = errors.New("a chosen port was taken before the control plane bound it")

// BinDir returns the directory holding the environment's binaries: $KIP_TESTENV_BIN, else
// <repository root>/bin/testenv.
func BinDir() (string, error) {
	if d := os.Getenv("KIP_TESTENV_BIN"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "testenv"), nil
}

func findBinaries(names ...string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", &missingError{reason: err.Error()}
	}
	var missing []string
	for _, name := range names {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", &missingError{reason: fmt.Sprintf("test API server binaries not built: run make testenv (%s missing in %s)", strings.Join(missing, ", "), dir)}
	}
	return dir, nil
}

// Start starts a control plane for t alone and stops it when t's cleanup runs. Most tests want
// Get, which shares one environment per test binary.
func Start(t testing.TB) *Env {
	t.Helper()
	e, err := start(t.Logf)
	var missing *missingError
	if errors.As(err, &missing) {
		need.Missing(t, "%s", missing.reason)
	}
	if err != nil {
		t.Fatalf("start test environment: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs(t.Logf)
		}
		e.Stop()
	})
	return e
}

// shared is the environment of the test binary, see Get.
var shared struct {
	mu      sync.Mutex
	inMain  bool
	started bool
	env     *Env
	err     error
}

// Main runs a package's tests (call it from TestMain) and stops the shared environment, if a
// test started one, when they end. On failure it prints the tail of each process's log.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	env := shared.env
	shared.env = nil
	shared.mu.Unlock()
	if env != nil {
		if code != 0 {
			env.dumpLogs(func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) })
		}
		env.Stop()
	}
	return code
}

// Get returns the test binary's shared environment, starting it on first use. It is stopped when
// Main returns; without Main (no TestMain) its processes die with the test binary and its
// directory is removed by the next environment started on the machine.
func Get(t testing.TB) *Env {
	t.Helper()
	shared.mu.Lock()
	if !shared.started {
		shared.started = true
		if !shared.inMain {
			t.Logf("testenv: Get without testenv.Main in TestMain: the environment stops when the test binary exits")
		}
		shared.env, shared.err = start(t.Logf)
	}
	env, err := shared.env, shared.err
	shared.mu.Unlock()
	var missing *missingError
	if errors.As(err, &missing) {
		need.Missing(t, "%s", missing.reason)
	}
	if err != nil {
		t.Fatalf("start shared test environment: %v", err)
	}
	if env == nil {
		t.Fatalf("shared test environment already stopped")
	}
	return env
}

func start(logf func(string, ...any)) (*Env, error) {
	bin, err := findBinaries(controlPlaneBinaries...)
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	sources, err := crdSources(root)
	if err != nil {
		return nil, err
	}
	crds, err := loadCRDs(sources)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		e, err := startOnce(bin, crds)
		if err == nil {
			logf("testenv: control plane ready in %s (%s)", e.StartupTime.Round(time.Millisecond), e.Timings)
			return e, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
		logf("testenv: %v; starting again on other ports", err)
	}
}

const serviceCIDR = "10.43.0.0/16"

func startOnce(bin string, crds []*apiextensionsv1.CustomResourceDefinition) (_ *Env, err error) {
	began := time.Now()
	controlplane.ReapStale(dirPrefix)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create environment directory: %w", err)
	}
	e := &Env{Dir: dir, binDir: bin, done: make(chan struct{})}
	defer func() {
		if err == nil {
			return
		}
		for _, p := range e.procs {
			if p.LogContains("address already in use") {
				err = fmt.Errorf("%s: %w", p.Name, errPortTaken)
				break
			}
		}
		if !errors.Is(err, errPortTaken) {
			err = fmt.Errorf("%w\n%s", err, e.logTails(30))
		}
		e.Stop()
	}()
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, fmt.Errorf("write owner.pid: %w", err)
	}
	// A bound, not a measure: on a loaded 2-core machine (the lab's hosts and the fault-injection
	// packages beside the API tier) the control plane and its CRDs took over 3 minutes to come up.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	pk, err := newPKI()
	if err != nil {
		return nil, err
	}
	if err := pk.writeFiles(dir); err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	etcdPort, peerPort, apiPort, kcmPort, schedPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	path := func(name string) string { return filepath.Join(dir, name) }
	var timings []string
	mark := func(what string, since time.Time) {
		timings = append(timings, what+" "+time.Since(since).Round(time.Millisecond).String())
	}

	// etcd
	t0 := time.Now()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd, err := e.spawn("etcd", append(controlplane.Etcd{
		Name:      "testenv",
		DataDir:   path("etcd"),
		ClientURL: etcdURL,
		PeerURL:   peerURL,
	}.Args(), "--unsafe-no-fsync"))
	if err != nil {
		return nil, err
	}
	plain := &http.Client{Timeout: 2 * time.Second}
	if err := waitHTTP(ctx, plain, etcd, etcdURL+"/health", `"health":"true"`); err != nil {
		return nil, fmt.Errorf("wait for etcd: %w", err)
	}
	mark("etcd", t0)

	// kube-apiserver
	t0 = time.Now()
	apiserver, err := e.spawn("kube-apiserver", append(controlplane.APIServer{
		EtcdURL:                      etcdURL,
		BindAddress:                  "127.0.0.1",
		AdvertiseAddress:             "127.0.0.1", // so no endpoint reconciler: default/kubernetes has no endpoints
		SecurePort:                   apiPort,
		CertDir:                      path("apiserver-certs"),
		TLSCertFile:                  path("apiserver.crt"),
		TLSKeyFile:                   path("apiserver.key"),
		ClientCAFile:                 path("ca.crt"),
		ServiceAccountKeyFile:        path("sa.pub"),
		ServiceAccountSigningKeyFile: path("sa.key"),
		ServiceCIDR:                  serviceCIDR,
	}.Args(), "--v=1"))
	if err != nil {
		return nil, err
	}
	e.Config = restConfig(server, pk.ca.CertPEM, pk.admin)
	if e.Kube, err = kubernetes.NewForConfig(e.Config); err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	if err := waitAPIServer(ctx, e.Kube, apiserver); err != nil {
		return nil, err
	}
	mark("kube-apiserver", t0)
	e.KubeconfigPath = path("admin.kubeconfig")
	for _, k := range []struct {
		file, user string
		creds      *controlplane.KeyPair
	}{
		{"admin.kubeconfig", "admin", pk.admin},
		{"controller-manager.kubeconfig", "system:kube-controller-manager", pk.kcm},
		{"scheduler.kubeconfig", "system:kube-scheduler", pk.sched},
	} {
		if err := writeKubeconfig(path(k.file), server, k.user, pk.ca.CertPEM, k.creds); err != nil {
			return nil, err
		}
	}

	// controller-manager and scheduler start while the CRDs are created.
	t0 = time.Now()
	kcm, err := e.spawn("kube-controller-manager", append(controlplane.ControllerManager{
		Kubeconfig:            path("controller-manager.kubeconfig"),
		SecurePort:            kcmPort,
		CertDir:               path("controller-manager-certs"),
		ServiceAccountKeyFile: path("sa.key"),
		RootCAFile:            path("ca.crt"),
		ServiceCIDR:           serviceCIDR,
	}.Args(),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--cluster-signing-cert-file="+path("ca.crt"),
		"--cluster-signing-key-file="+path("ca.key"),
		"--v=1",
	))
	if err != nil {
		return nil, err
	}
	sched, err := e.spawn("kube-scheduler", append(controlplane.Scheduler{
		Kubeconfig: path("scheduler.kubeconfig"),
		SecurePort: schedPort,
		CertDir:    path("scheduler-certs"),
	}.Args(), "--v=1"))
	if err != nil {
		return nil, err
	}

	t1 := time.Now()
	quiet := rest.CopyConfig(e.Config)
	quiet.WarningHandler = rest.NoWarnings{} // Velero's CRDs draw "unrecognized format" warnings
	ext, err := apiextensionsclientset.NewForConfig(quiet)
	if err != nil {
		return nil, fmt.Errorf("apiextensions client: %w", err)
	}
	if err := installCRDs(ctx, ext, crds); err != nil {
		return nil, err
	}
	mark(fmt.Sprintf("%d CRDs", len(crds)), t1)

	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the components' self-signed serving certificates
	}}
	if err := waitHTTP(ctx, insecure, kcm, fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort), "ok"); err != nil {
		return nil, fmt.Errorf("wait for kube-controller-manager: %w", err)
	}
	mark("controller-manager healthy", t0)
	if err := waitHTTP(ctx, insecure, sched, fmt.Sprintf("https://127.0.0.1:%d/healthz", schedPort), "ok"); err != nil {
		return nil, fmt.Errorf("wait for kube-scheduler: %w", err)
	}
	mark("scheduler healthy", t0)
	// The service-account controller creating default/default shows the controllers run.
	if err := waitServiceAccount(ctx, e.Kube, "default", kcm); err != nil {
		return nil, err
	}
	mark("controllers working", t0)
	e.StartupTime = time.Since(began)
	e.Timings = strings.Join(timings, ", ")
	return e, nil
}

func (e *Env) spawn(name string, args []string, env ...string) (*process, error) {
	p, err := spawn(e.Dir, name, filepath.Join(e.binDir, name), args, env)
	if err != nil {
		return nil, err
	}
	e.procs = append(e.procs, p)
	return p, nil
}

// KeepEnv names the environment variable that, when set, keeps an environment's directory (data,
// certificates, kubeconfigs, logs) after Stop, for debugging.
const KeepEnv = "KIP_TESTENV_KEEP"

// Stop kills every process of the environment (kwok, scheduler, controller-manager,
// kube-apiserver, etcd), checks none survived and removes Dir (unless $KIP_TESTENV_KEEP is set).
// It is safe to call more than once.
func (e *Env) Stop() {
	e.stopOnce.Do(func() {
		close(e.done)
		e.kwokMu.Lock()
		procs := append([]*process(nil), e.procs...)
		if e.kwok != nil {
			procs = append(procs, e.kwok)
		}
		e.kwokMu.Unlock()
		for i := len(procs) - 1; i >= 0; i-- {
			if err := procs[i].kill(); err != nil {
				fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			}
		}
		for _, p := range procs {
			if controlplane.GroupAlive(p.Pid()) {
				fmt.Fprintf(os.Stderr, "testenv: %s (process group %d) survived Stop\n", p.Name, p.Pid())
			}
		}
		if e.Dir != "" && os.Getenv(KeepEnv) == "" {
			_ = os.RemoveAll(e.Dir)
		} else if e.Dir != "" {
			fmt.Fprintf(os.Stderr, "testenv: %s set: keeping %s\n", KeepEnv, e.Dir)
		}
	})
}

// pids returns the process ids of the environment's processes.
func (e *Env) pids() map[string]int {
	e.kwokMu.Lock()
	defer e.kwokMu.Unlock()
	m := map[string]int{}
	for _, p := range e.procs {
		m[p.Name] = p.Pid()
	}
	if e.kwok != nil {
		m[e.kwok.Name] = e.kwok.Pid()
	}
	return m
}

func (e *Env) logTails(n int) string {
	e.kwokMu.Lock()
	procs := append([]*process(nil), e.procs...)
	if e.kwok != nil {
		procs = append(procs, e.kwok)
	}
	e.kwokMu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "----- %s (last %d lines of %s) -----\n%s\n", p.Name, n, p.LogPath, p.Tail(n))
	}
	return b.String()
}

func (e *Env) dumpLogs(logf func(string, ...any)) {
	logf("testenv: logs of the control plane in %s:\n%s", e.Dir, e.logTails(60))
}

// waitHTTP polls url until it answers 200 with a body containing want, or p exits.
func waitHTTP(ctx context.Context, client *http.Client, p *process, url, want string) error {
	err := controlplane.Poll(ctx, 50*time.Millisecond, p.Done(), p.ExitError, func(ctx context.Context) error {
		return controlplane.HTTPOK(ctx, client, url, want)
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s not healthy: %w", url, err)
	}
	return err
}

// waitAPIServer polls kube-apiserver's /readyz until it answers OK, or p exits.
func waitAPIServer(ctx context.Context, kube kubernetes.Interface, p *process) error {
	err := controlplane.Poll(ctx, 100*time.Millisecond, p.Done(), p.ExitError, func(ctx context.Context) error {
		return controlplane.APIServerReady(ctx, kube)
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("wait for kube-apiserver /readyz: %w", err)
	}
	return err
}
