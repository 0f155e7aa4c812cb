// Package velerotest runs a real Velero server for kip's backup tests: against a test/testenv
// control plane (Start), storing into a real S3-compatible server on loopback, or in a lab
// cluster whose nodes run containers (StartInCluster, incluster.go), as its chart runs it.
//
// The Velero server (v1.18.3) and its AWS object-store plugin (v1.14.2) are built from their Go
// modules at the pins of manifests/versions.yaml, and gofakes3 (v1.2.0) is the S3 server, by
// tools/testenv.sh (make testenv) into bin/velero. Start runs them as child processes and sets
// Velero up as kip's install does: namespace velero, the credentials Secret velero-credentials
// (key cloud, an AWS shared-credentials file), a BackupStorageLocation named default (provider
// aws, path-style S3 at the loopback URL, region minio), Kopia as the uploader and every volume
// to file-system backup by default, and the chart's velero Deployment as a record that Velero
// and kip read (the server is the process, not its pod). gofakes3 does not check credentials.
// Start runs no node agent, so file-system backups of volumes are not exercised there: back up
// objects, not volume data. StartInCluster runs the node agent too.
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
//	func TestBackup(t *testing.T) {
//		env := testenv.Get(t)
//		v := velerotest.Start(t, env) // stopped, and namespace velero deleted, at cleanup
//		... create a velero.io/v1 Backup in v.Namespace, wait for Completed ...
//		keys := v.Objects(t, "backups/"+name+"/")
//	}
//
// One Server at a time runs against an environment (Velero's namespace is fixed): a second
// Start on the same environment waits until the first's test has ended. When the binaries are
// missing, tests skip locally and fail under CI=true (see test/need).
package velerotest

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/manifests"
	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/need"
	"kipper.run/kip/test/testenv"
)

// What Start sets up, named as kip's install names them (internal/components/backups.go).
const (
	// Namespace is Velero's namespace.
	Namespace = components.VeleroNamespace
	// Location is the BackupStorageLocation's name.
	Location = components.BackupLocation
	// CredentialsSecret holds the S3 credentials, under CredentialsKey, in the AWS
	// shared-credentials form kip writes.
	CredentialsSecret = components.VeleroCredentialsSecret
	CredentialsKey    = components.VeleroCredentialsKey
	// Bucket is the one bucket of the S3 server.
	Bucket = "kip-backups"
	// Region is the location's region, as kip configures it for in-cluster MinIO.
	Region = "minio"
	// Deployment and ServerServiceAccount are the names the chart gives the server's Deployment
	// and ServiceAccount (see applyDeployment).
	Deployment           = components.VeleroDeployment
	ServerServiceAccount = "velero-server"
	// AccessKeyID and SecretAccessKey are the credentials in the Secret; gofakes3 accepts any.
	AccessKeyID     = "kiptest"
	SecretAccessKey = "kiptest-secret"
)

// The binaries Start runs, found in BinDir.
const (
	veleroBinary   = "velero"
	pluginBinary   = "plugins/velero-plugin-for-aws"
	gofakes3Binary = "gofakes3"
)

// Velero's resources, for Backup, Restore and the others.
var (
	BackupResource   = velerov1.SchemeGroupVersion.WithResource("backups")
	RestoreResource  = velerov1.SchemeGroupVersion.WithResource("restores")
	LocationResource = velerov1.SchemeGroupVersion.WithResource("backupstoragelocations")
)

// Server is a running Velero server and its S3 server. Its exported fields are read-only.
type Server struct {
	// Namespace, Location and Bucket repeat the constants, for convenience.
	Namespace, Location, Bucket string
	// S3URL is the S3 server's endpoint, http://127.0.0.1:<port>: the location's s3Url.
	S3URL string
	// Dir holds the S3 server's data (s3.db), the credentials file, and the logs velero.log and
	// gofakes3.log; it is removed at cleanup unless $KIP_TESTENV_KEEP is set.
	Dir string

	env  *testenv.Env
	bin  string
	kube kubernetes.Interface
	dyn  dynamic.Interface
	http *http.Client

	mu     sync.Mutex
	velero *process
	s3     *process
}

// pinnedImage is the image reference manifests/versions.yaml pins for component name.
func pinnedImage(name string) (string, error) {
	pins, err := manifests.Pinned()
	if err != nil {
		return "", err
	}
	c, err := pins.Component(name)
	if err != nil {
		return "", err
	}
	return c.Image + ":" + c.Version, nil
}

func httpClient() *http.Client { return &http.Client{Timeout: 10 * time.Second} }

// BinDir is the directory of the binaries: $KIP_VELERO_BIN, else <repository root>/bin/velero.
func BinDir() (string, error) {
	if d := os.Getenv("KIP_VELERO_BIN"); d != "" {
		return d, nil
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "velero"), nil
}

func findBinaries(t testing.TB) string {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		need.Missing(t, "velero test binaries: %v", err)
	}
	var missing []string
	for _, name := range []string{veleroBinary, pluginBinary, gofakes3Binary} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		need.Missing(t, "velero test binaries not built: run make testenv or sh tools/testenv.sh velero (%s missing in %s)", strings.Join(missing, ", "), dir)
	}
	return dir
}

// slots lets one Server at a time run against an environment.
var slots struct {
	mu     sync.Mutex
	byEnv  map[*testenv.Env]chan struct{}
	holder map[*testenv.Env]string
}

func acquire(t testing.TB, env *testenv.Env) {
	t.Helper()
	slots.mu.Lock()
	if slots.byEnv == nil {
		slots.byEnv = map[*testenv.Env]chan struct{}{}
		slots.holder = map[*testenv.Env]string{}
	}
	slot := slots.byEnv[env]
	if slot == nil {
		slot = make(chan struct{}, 1)
		slots.byEnv[env] = slot
	}
	holder := slots.holder[env]
	slots.mu.Unlock()
	select {
	case slot <- struct{}{}:
	default:
		if holder == t.Name() || strings.HasPrefix(t.Name(), holder+"/") {
			t.Fatalf("velerotest: %s already started a Velero server on this environment; one at a time runs per environment (use testenv.Start for another)", holder)
		}
		t.Logf("velerotest: waiting for %s's Velero server on this environment to stop", holder)
		slot <- struct{}{}
	}
	slots.mu.Lock()
	slots.holder[env] = t.Name()
	slots.mu.Unlock()
}

func release(env *testenv.Env) {
	slots.mu.Lock()
	delete(slots.holder, env)
	slot := slots.byEnv[env]
	slots.mu.Unlock()
	<-slot
}

const dirPrefix = "kip-velero-"

// Start runs gofakes3 on a free loopback port (its bolt backend in Dir, one bucket)
// and a Velero server against env, in namespace velero, with the credentials Secret and the
// BackupStorageLocation default; it returns once the location is Available. At t's cleanup it
// stops both, removes the finalizers of Velero's objects in the namespace (no server is left to
// act on them) and deletes the namespace without waiting: the next Start waits for it to go.
func Start(t testing.TB, env *testenv.Env) *Server {
	t.Helper()
	bin := findBinaries(t)
	acquire(t, env)
	began := time.Now()
	s, err := newServer(bin, env.Config)
	if err != nil {
		release(env)
		t.Fatalf("velerotest: %v", err)
	}
	s.env = env
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("velerotest: logs in %s:\n%s", s.Dir, s.logTails(80))
		}
		s.teardown(t)
		release(env)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if err := s.ensureNamespace(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	t0 := time.Now()
	if err := s.startS3(ctx, "127.0.0.1"); err != nil {
		t.Fatalf("velerotest: %v\n%s", err, s.logTails(30))
	}
	s3Time := time.Since(t0)
	t0 = time.Now()
	if err := s.configure(ctx); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
	objectsTime := time.Since(t0)
	t0 = time.Now()
	if err := s.startVelero(ctx); err != nil {
		t.Fatalf("velerotest: %v\n%s", err, s.logTails(40))
	}
	if err := s.waitLocation(ctx); err != nil {
		t.Fatalf("velerotest: %v\n%s", err, s.logTails(40))
	}
	t.Logf("velerotest: Velero server ready in %s (gofakes3 %s at %s, objects %s, velero until the location is Available %s)",
		time.Since(began).Round(time.Millisecond), s3Time.Round(time.Millisecond), s.S3URL,
		objectsTime.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	return s
}

// newServer makes a Server's directory (its owner recorded, for ReapStale) and API clients.
func newServer(bin string, cfg *rest.Config) (*Server, error) {
	controlplane.ReapStale(dirPrefix)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	s := &Server{Namespace: Namespace, Location: Location, Bucket: Bucket, Dir: dir, bin: bin, http: httpClient()}
	if err := os.WriteFile(filepath.Join(dir, controlplane.OwnerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	if s.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if s.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Stop stops the Velero server (SIGTERM, then SIGKILL after 20 s), for tests that need Velero not
// to act: Backups and Restores created meanwhile stay without a phase. The S3 server and its
// objects stay.
// Stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stopVelero(); err != nil {
		t.Fatalf("velerotest: %v", err)
	}
}

// Resume starts the Velero server again after Stop and returns once its controllers are
// starting. As after any restart, Velero marks Backups and Restores it finds InProgress as
// Failed. Resuming a running server does nothing.
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	running := s.velero != nil
	s.mu.Unlock()
	if running {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.startVelero(ctx); err != nil {
		t.Fatalf("velerotest: resume: %v\n%s", err, s.logTails(40))
	}
}

// Objects returns the keys in the bucket under prefix ("" for all), sorted, listed through the
// S3 API.
func (s *Server) Objects(t testing.TB, prefix string) []string {
	t.Helper()
	keys, err := s.listObjects(prefix)
	if err != nil {
		t.Fatalf("velerotest: list objects under %q: %v", prefix, err)
	}
	return keys
}

// Object returns the content of the object key in the bucket.
func (s *Server) Object(t testing.TB, key string) []byte {
	t.Helper()
	resp, err := s.http.Get(s.S3URL + "/" + Bucket + "/" + (&url.URL{Path: key}).EscapedPath())
	if err != nil {
		t.Fatalf("velerotest: get object %s: %v", key, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("velerotest: get object %s: %s %v: %s", key, resp.Status, err, firstLine(data))
	}
	return data
}

// ensureNamespace creates Velero's namespace, after waiting for a previous Server's to be gone.
func (s *Server) ensureNamespace(ctx context.Context) error {
	for {
		ns, err := s.kube.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil {
			return fmt.Errorf("get namespace %s: %w", Namespace, err)
		}
		if ns.DeletionTimestamp == nil {
			return nil
		}
		s.clearFinalizers(ctx)
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s still terminating: %w", Namespace, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	_, err := s.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", Namespace, err)
	}
	return nil
}

// configure writes the credentials Secret and the BackupStorageLocation, and the credentials
// file Velero reads: the chart kip installs mounts the Secret at /credentials and points
// AWS_SHARED_CREDENTIALS_FILE at its key cloud, as startVelero does here.
func (s *Server) configure(ctx context.Context) error {
	creds := components.AWSCredentials(AccessKeyID, SecretAccessKey)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CredentialsSecret, Namespace: Namespace},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{CredentialsKey: creds},
	}
	if _, err := s.kube.CoreV1().Secrets(Namespace).Create(ctx, secret, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = s.kube.CoreV1().Secrets(Namespace).Update(ctx, secret, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update secret %s: %w", CredentialsSecret, err)
		}
	} else if err != nil {
		return fmt.Errorf("create secret %s: %w", CredentialsSecret, err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir, "credentials"), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(s.credentialsFile(), creds, 0o600); err != nil {
		return err
	}

	if err := s.applyDeployment(ctx); err != nil {
		return err
	}

	bsl := &velerov1.BackupStorageLocation{
		TypeMeta:   metav1.TypeMeta{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: "BackupStorageLocation"},
		ObjectMeta: metav1.ObjectMeta{Name: Location, Namespace: Namespace},
		Spec: velerov1.BackupStorageLocationSpec{
			Provider: "aws",
			Default:  true,
			StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{
				Bucket: Bucket,
			}},
			Config: map[string]string{
				"region":           Region,
				"s3Url":            s.S3URL,
				"s3ForcePathStyle": "true",
			},
		},
	}
	obj, err := toUnstructured(bsl)
	if err != nil {
		return err
	}
	locations := s.dyn.Resource(LocationResource).Namespace(Namespace)
	if _, err := locations.Create(ctx, obj, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// One a test made before Start: its spec becomes Start's, its status is cleared so that
		// the server validates it at once.
		live, err := locations.Get(ctx, Location, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get backup storage location %s: %w", Location, err)
		}
		// (Velero's CRD has no status subresource: one update writes both.)
		live.Object["spec"] = obj.Object["spec"]
		delete(live.Object, "status")
		if _, err := locations.Update(ctx, live, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update backup storage location %s: %w", Location, err)
		}
	} else if err != nil {
		return fmt.Errorf("create backup storage location %s: %w", Location, err)
	}
	return nil
}

func (s *Server) credentialsFile() string { return filepath.Join(s.Dir, "credentials", "cloud") }

// applyDeployment writes the record of the server that the chart kip installs would make: the
// Deployment velero and its ServiceAccount velero-server. The server Start runs is a process, not
// this Deployment's pod (which runs, as kwok's, only once the test has a Node), but Velero reads
// the Deployment: a restore's pod-volume action takes the restore helper's image from its velero
// container and refuses to run without it, and repository maintenance Jobs copy its env and
// volumes. So does kip (the mounts of the velero container). Its velero container is the chart's
// as kip configures it (internal/components/backups.go): the pinned image, kip's server flags,
// the Secret mounted at /credentials with AWS_SHARED_CREDENTIALS_FILE pointing at its key, and
// the AWS plugin's init container filling /plugins.
func (s *Server) applyDeployment(ctx context.Context) error {
	server, err := pinnedImage("velero")
	if err != nil {
		return err
	}
	plugin, err := pinnedImage("velero-plugin-for-aws")
	if err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ServerServiceAccount, Namespace: Namespace}}
	if _, err := s.kube.CoreV1().ServiceAccounts(Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s: %w", ServerServiceAccount, err)
	}
	labels := map[string]string{"app.kubernetes.io/name": "velero", "app.kubernetes.io/instance": "velero"}
	credentials := "/credentials/" + CredentialsKey
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: Deployment, Namespace: Namespace, Labels: map[string]string{
			"app.kubernetes.io/name": "velero", "app.kubernetes.io/instance": "velero", "component": "velero",
		}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
					"name": "velero", "app.kubernetes.io/name": "velero", "app.kubernetes.io/instance": "velero",
				}},
				Spec: corev1.PodSpec{
					ServiceAccountName: ServerServiceAccount,
					InitContainers: []corev1.Container{{
						Name:            "velero-plugin-for-aws",
						Image:           plugin,
						ImagePullPolicy: corev1.PullIfNotPresent,
						VolumeMounts:    []corev1.VolumeMount{{Name: "plugins", MountPath: "/target"}},
					}},
					Containers: []corev1.Container{{
						Name:            "velero",
						Image:           server,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/velero"},
						Args:            []string{"server", "--uploader-type=kopia", "--default-volumes-to-fs-backup"},
						Ports:           []corev1.ContainerPort{{Name: "http-monitoring", ContainerPort: 8085}},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "plugins", MountPath: "/plugins"},
							{Name: "cloud-credentials", MountPath: "/credentials"},
							{Name: "scratch", MountPath: "/scratch"},
						},
						Env: []corev1.EnvVar{
							{Name: "VELERO_SCRATCH_DIR", Value: "/scratch"},
							{Name: "VELERO_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
							{Name: "LD_LIBRARY_PATH", Value: "/plugins"},
							{Name: "AWS_SHARED_CREDENTIALS_FILE", Value: credentials},
							{Name: "GOOGLE_APPLICATION_CREDENTIALS", Value: credentials},
							{Name: "AZURE_CREDENTIALS_FILE", Value: credentials},
							{Name: "ALIBABA_CLOUD_CREDENTIALS_FILE", Value: credentials},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "cloud-credentials", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: CredentialsSecret}}},
						{Name: "plugins", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
	deployments := s.kube.AppsV1().Deployments(Namespace)
	if _, err := deployments.Create(ctx, d, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// One a test made before Start, say from kip's own rendering: it stays.
		return nil
	} else if err != nil {
		return fmt.Errorf("create deployment %s: %w", Deployment, err)
	}
	return nil
}

var s3Port = regexp.MustCompile(`using port: (\d+)`)

// startS3 starts gofakes3 on a port the kernel picks (it logs it) and waits until it lists the
// bucket.
func (s *Server) startS3(ctx context.Context, host string) error {
	p, err := s.spawn("gofakes3", filepath.Join(s.bin, gofakes3Binary), []string{
		// The bolt backend: the fs one answers NoSuchBucket to a listing of a prefix that holds
		// nothing yet, which Kopia makes when it creates a repository.
		"-backend", "bolt", "-bolt.db", filepath.Join(s.Dir, "s3.db"),
		"-initialbucket", Bucket, "-host", net.JoinHostPort(host, "0"),
	}, nil)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.s3 = p
	s.mu.Unlock()
	err = controlplane.Poll(ctx, 50*time.Millisecond, p.Done(), p.ExitError, func(context.Context) error {
		data, _ := os.ReadFile(p.LogPath)
		m := s3Port.FindSubmatch(data)
		if m == nil {
			return errors.New("no port in its log yet")
		}
		s.S3URL = "http://" + net.JoinHostPort(host, string(m[1]))
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for gofakes3's port: %w", err)
	}
	err = controlplane.Poll(ctx, 50*time.Millisecond, p.Done(), p.ExitError, func(ctx context.Context) error {
		return controlplane.HTTPOK(ctx, s.http, s.S3URL+"/", "<Name>"+Bucket+"</Name>")
	})
	if err != nil {
		return fmt.Errorf("wait for gofakes3 to list bucket %s: %w", Bucket, err)
	}
	return nil
}

// startVelero starts `velero server` and waits until its metrics answer, which it serves as its
// controllers start. A metrics port taken meanwhile means another try on another port.
func (s *Server) startVelero(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		metrics := fmt.Sprintf("127.0.0.1:%d", port)
		args := []string{
			"server",
			"--kubeconfig=" + s.env.KubeconfigPath,
			"--namespace=" + Namespace,
			"--plugin-dir=" + filepath.Join(s.bin, filepath.Dir(pluginBinary)),
			"--metrics-address=" + metrics,
			"--profiler-address=", // no pprof listener
			// kip's chart configuration (internal/components/backups.go).
			"--uploader-type=kopia",
			"--default-volumes-to-fs-backup=true",
			"--log-format=text",
		}
		home := filepath.Join(s.Dir, "home")
		tmp := filepath.Join(s.Dir, "tmp") // also Velero's credentials file store, os.TempDir()/credentials
		for _, d := range []string{home, tmp} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return err
			}
		}
		p, err := s.spawn("velero", filepath.Join(s.bin, veleroBinary), args, []string{
			"HOME=" + home,
			"TMPDIR=" + tmp,
			"VELERO_NAMESPACE=" + Namespace,
			"AWS_SHARED_CREDENTIALS_FILE=" + s.credentialsFile(),
		})
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.velero = p
		s.mu.Unlock()
		err = controlplane.Poll(ctx, 100*time.Millisecond, p.Done(), p.ExitError, func(ctx context.Context) error {
			return controlplane.HTTPOK(ctx, s.http, "http://"+metrics+"/metrics", "")
		})
		if err == nil {
			return nil
		}
		if p.Exited() && p.LogContains("address already in use") && attempt < 3 {
			s.mu.Lock()
			s.velero = nil
			s.mu.Unlock()
			continue
		}
		return fmt.Errorf("wait for the velero server's metrics at %s: %w", metrics, err)
	}
}

// waitLocation waits until the server has validated the location (configure left it without a
// status) as Available; a server process of Start's that exits meanwhile ends the wait.
func (s *Server) waitLocation(ctx context.Context) error {
	s.mu.Lock()
	p := s.velero
	s.mu.Unlock()
	var exited <-chan struct{} // StartInCluster's server is a pod: no process to watch
	exitErr := func() error { return nil }
	if p != nil {
		exited, exitErr = p.Done(), p.ExitError
	}
	var last string
	err := controlplane.Poll(ctx, 200*time.Millisecond, exited, exitErr, func(ctx context.Context) error {
		u, err := s.dyn.Resource(LocationResource).Namespace(Namespace).Get(ctx, Location, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var bsl velerov1.BackupStorageLocation
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &bsl); err != nil {
			return err
		}
		st := bsl.Status
		last = fmt.Sprintf("phase %q, message %q", st.Phase, st.Message)
		if st.LastValidationTime == nil {
			return fmt.Errorf("not validated yet (%s)", last)
		}
		if st.Phase != velerov1.BackupStorageLocationPhaseAvailable {
			return fmt.Errorf("backup storage location %s: %s", Location, last)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for backup storage location %s to be Available: %w", Location, err)
	}
	return nil
}

func (s *Server) stopVelero() error {
	s.mu.Lock()
	p := s.velero
	s.velero = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	if !p.Stop(syscall.SIGTERM, 20*time.Second) {
		if !p.Stop(syscall.SIGKILL, 20*time.Second) {
			return fmt.Errorf("velero server (pid %d) did not exit after SIGKILL", p.Pid())
		}
	}
	if controlplane.GroupAlive(p.Pid()) {
		return fmt.Errorf("velero server's process group %d survived its stop", p.Pid())
	}
	return nil
}

func (s *Server) teardown(t testing.TB) {
	if err := s.stopVelero(); err != nil {
		t.Errorf("velerotest: %v", err)
	}
	s.stopS3(t)
	if s.kube != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s.clearFinalizers(ctx)
		err := s.kube.CoreV1().Namespaces().Delete(ctx, Namespace, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("velerotest: delete namespace %s: %v", Namespace, err)
		}
	}
	if os.Getenv(testenv.KeepEnv) == "" {
		_ = os.RemoveAll(s.Dir)
	} else {
		t.Logf("velerotest: %s set: keeping %s", testenv.KeepEnv, s.Dir)
	}
}

// stopS3 stops gofakes3; the bucket's file stays in Dir.
func (s *Server) stopS3(t testing.TB) {
	s.mu.Lock()
	p := s.s3
	s.s3 = nil
	s.mu.Unlock()
	if p != nil && !p.Stop(syscall.SIGKILL, 20*time.Second) {
		t.Errorf("velerotest: gofakes3 (pid %d) did not exit after SIGKILL", p.Pid())
	}
}

// veleroResources are Velero's namespaced resources, some of which carry finalizers only a
// running server removes (a Restore's, a DataUpload's).
var veleroResources = []schema.GroupVersionResource{
	BackupResource, RestoreResource, LocationResource,
	velerov1.SchemeGroupVersion.WithResource("volumesnapshotlocations"),
	velerov1.SchemeGroupVersion.WithResource("schedules"),
	velerov1.SchemeGroupVersion.WithResource("podvolumebackups"),
	velerov1.SchemeGroupVersion.WithResource("podvolumerestores"),
	velerov1.SchemeGroupVersion.WithResource("backuprepositories"),
	velerov1.SchemeGroupVersion.WithResource("deletebackuprequests"),
	velerov1.SchemeGroupVersion.WithResource("downloadrequests"),
	velerov1.SchemeGroupVersion.WithResource("serverstatusrequests"),
	{Group: "velero.io", Version: "v2alpha1", Resource: "datauploads"},
	{Group: "velero.io", Version: "v2alpha1", Resource: "datadownloads"},
}

// clearFinalizers removes the finalizers of Velero's objects in its namespace, so that the
// namespace can go while no server runs.
func (s *Server) clearFinalizers(ctx context.Context) {
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	for _, gvr := range veleroResources {
		list, err := s.dyn.Resource(gvr).Namespace(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		for _, o := range list.Items {
			if len(o.GetFinalizers()) > 0 {
				_, _ = s.dyn.Resource(gvr).Namespace(Namespace).Patch(ctx, o.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
			}
		}
	}
}

// listBucketResult is the part of S3's ListObjectsV2 answer listObjects reads.
type listBucketResult struct {
	Contents []struct {
		Key string `xml:"Key"`
	} `xml:"Contents"`
	IsTruncated           bool   `xml:"IsTruncated"`
	NextContinuationToken string `xml:"NextContinuationToken"`
}

func (s *Server) listObjects(prefix string) ([]string, error) {
	var keys []string
	token := ""
	for {
		q := url.Values{"list-type": {"2"}, "prefix": {prefix}}
		if token != "" {
			q.Set("continuation-token", token)
		}
		resp, err := s.http.Get(s.S3URL + "/" + Bucket + "?" + q.Encode())
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: %s", resp.Status, firstLine(data))
		}
		var r listBucketResult
		if err := xml.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("decode ListObjectsV2 answer: %w", err)
		}
		for _, c := range r.Contents {
			keys = append(keys, c.Key)
		}
		if !r.IsTruncated || r.NextContinuationToken == "" {
			break
		}
		token = r.NextContinuationToken
	}
	sort.Strings(keys)
	return keys, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// process is a child program in its own process group (controlplane.Spawn: it dies with the
// test binary), its output appended to <Dir>/<name>.log.
type process struct{ *controlplane.Logged }

// spawn starts bin, an absolute path: Velero runs its os.Args[0] for its own plugins.
func (s *Server) spawn(name, bin string, args, env []string) (*process, error) {
	p, err := controlplane.Spawn(s.Dir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	return &process{p}, nil
}

// logTails returns the last n lines of each log.
func (s *Server) logTails(n int) string {
	var b strings.Builder
	for _, name := range []string{"velero", "gofakes3"} {
		path := filepath.Join(s.Dir, name+".log")
		fmt.Fprintf(&b, "----- %s (last %d lines of %s) -----\n%s\n", name, n, path, controlplane.TailFile(path, n))
	}
	return b.String()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
