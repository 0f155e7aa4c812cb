// Package components is kip's component catalogue: what a Kipper cluster runs (Kipper's CRDs and
// base objects, Traefik, cert-manager, Longhorn, Dex, Zot, KEDA, MinIO and Velero, Prometheus and
// Loki, the console), rendered from Options (Render, or Recorded from the cluster record), applied
// at the pinned version and waited for (Apply, Step), and judged ready (Status, StatusFrom). One
// file per component or family: kipper.go, edge.go (Traefik, cert-manager), longhorn.go, dex.go,
// zot.go, keda.go, backups.go (MinIO, Velero), monitoring.go (Prometheus, Loki). install, platform
// and status use it; kip upgrade will reconcile the same components.
package components

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net/mail"
	"net/netip"
	"net/url"
	"strings"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/manifests"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

// Labels and annotations kip puts on what it applies.
const (
	managedByLabel = "app.kubernetes.io/managed-by"
	partOfLabel    = "app.kubernetes.io/part-of"
	// KipVersionAnnotation on the App CRD (AppCRD) records the kip that last wrote the Kipper
	// schemas.
	KipVersionAnnotation = "kipper.run/kip-version"
	// configHashAnnotation on Dex's pods rolls them when the Dex config changes: the chart reads the
	// config from a Secret it does not watch.
	configHashAnnotation = "kipper.run/config-sha256"
	// helmReleaseAnnotation is how Helm marks the objects of a release.
	helmReleaseAnnotation = "meta.helm.sh/release-name"
)

// Namespaces and names.
const (
	systemNamespace = "kipper-system"
	// HelmChartNamespace is where kip applies the HelmCharts and k3s's helm-controller runs the
	// helm-install Jobs; k3s's own system (CoreDNS, the local-path provisioner, metrics-server)
	// runs there too.
	HelmChartNamespace = "kube-system"
	VeleroNamespace    = "velero"
	localPathClass     = "local-path" // k3s's local-path provisioner
	longhornClass      = "longhorn"
	clusterIssuer      = "letsencrypt"
	ingressClass       = "traefik"
	consoleClientID    = "kipper-console"
	// cliClientID is kip's own Dex client: the audience of the tokens the API server accepts.
	cliClientID = "kip"
	// operatorPrefix prefixes the email of a Dex login to make the operator's Kubernetes user name,
	// as the API server's authentication config maps it.
	operatorPrefix = "oidc:"
)

// Dex: kip renders Dex's whole configuration into a Secret (the chart reads its config from a
// Secret), and passes the initial admin's password hash and nothing else through the environment.
const (
	// dexNamespace, dexConfigSecret and dexConfigKey locate the Dex config (config.yaml) that a
	// re-run of kip install reads back (ReadDexConfig) into Options.ExistingDexConfig.
	dexNamespace    = "dex"
	dexConfigSecret = "dex-config"
	dexConfigKey    = "config.yaml"

	dexOIDCClientSecret = "dex-oidc-client" // the console's client secret, in dex and kipper-system
	// adminPasswordSecret holds the generated initial admin password and its bcrypt hash. kip creates
	// it once; Dex reads the hash through adminHashEnv, so the config never holds it.
	adminPasswordSecret = "kipper-admin-password"
	adminHashEnv        = "KIPPER_ADMIN_PASSWORD_HASH"
	// initialAdminBinding binds the admin's login (its email) to cluster-admin. kip creates it once:
	// its subjects change as admins are added and removed.
	initialAdminBinding = "kipper-admins"
)

// Backups: what Velero's chart is given, which kip backup and the backup tests read too.
const (
	// VeleroCredentialsSecret holds the external bucket's credentials, under VeleroCredentialsKey
	// (AWSCredentials); replaced on every run that gives them.
	VeleroCredentialsSecret = "velero-credentials"
	VeleroCredentialsKey    = "cloud"
	// BackupLocation is the name of Velero's one BackupStorageLocation.
	BackupLocation = "default"
	// VeleroDeployment is the chart's Deployment of the Velero server, and its server container.
	VeleroDeployment = "velero"
)

const (
	minioCredentialsSecret = "velero-minio-credentials" // in-cluster MinIO, created once
	minioBucket            = "velero"
	minioRootUser          = "kipper-backups"
	defaultBackupRegion    = "us-east-1"
)

// Volume sizes the profiles leave open.
const (
	minioVolumeSize      = "20Gi"
	prometheusVolumeSize = "10Gi"
	prometheusMaxTSDB    = "8GiB" // keeps Prometheus inside its volume whatever the retention
	lokiVolumeSize       = "10Gi"
)

// Ports.
const (
	consoleAPIPort        = 8080
	consoleAPIMetricsPort = 8081
	consolePort           = 80
	// RegistryNodePort is where every node's containerd reaches the Zot registry.
	RegistryNodePort = 30500
)

// Options is what the components of a cluster depend on.
type Options struct {
	// Sizing is the profile and storage install chose.
	Sizing cluster.Sizing
	// Monitoring comes from the cluster record; install sets Prometheus and Loki to
	// Sizing.Profile.Monitoring on a fresh install.
	Monitoring cluster.Monitoring
	// AdminEmail is --admin-email, the initial admin; it may be empty (no initial admin).
	AdminEmail string
	// ServerAddress is the server's public IPv4: the console answers at console.<ip>.sslip.io and
	// Dex at dex.<ip>.sslip.io. A DNS name (whose console. and dex. names the operator points at
	// the server) is used as it is: console.<name>, dex.<name>.
	ServerAddress string
	// Backups is external backup storage (--backup-storage-bucket); nil when there is none.
	Backups *BackupStorage
	// NoBackups keeps a Longhorn cluster without backups: one that grew from local storage
	// without external backup storage (kip cluster storage longhorn keeps its backup mode).
	NoBackups bool
	// Pinned are the versions this kip pins (manifests.Pinned).
	Pinned *manifests.Versions
	// KipVersion is this kip's version, recorded on the App CRD.
	KipVersion string
	// ExistingDexConfig is the cluster's current Dex config (ReadDexConfig) when install runs again
	// on a cluster; nil on a fresh install. Its static users are kept.
	ExistingDexConfig []byte
	// Kept are the components re-applied at the release the cluster runs (ReadRelease), by
	// name, with the values kip pins: Longhorn always (it moves to the pinned release only one
	// minor at a time, with kip upgrade --longhorn, never by a re-apply), cert-manager on kip
	// upgrade (a re-run of kip install moves its version, the upgrade only its values). A
	// component missing here, or kept at "", gets the pinned release.
	Kept map[string]string
}

// keepable are the components whose chart versions are their releases (Longhorn's without the
// v), so that a release the cluster runs names its chart: the only ones Options.Kept may keep.
var keepable = map[string]bool{"longhorn": true, "cert-manager": true}

// BackupStorage is an S3-compatible bucket Velero keeps backups in. Endpoint is empty for AWS S3;
// Region is us-east-1 when empty. Without credentials (a re-run without the backup flags), the
// cluster keeps the ones it has.
type BackupStorage struct {
	Bucket, Endpoint, Region, AccessKeyID, SecretAccessKey string
}

// Location is where the bucket is, without its credentials: what the cluster record keeps.
func (b *BackupStorage) Location() *cluster.BackupLocation {
	return &cluster.BackupLocation{Bucket: b.Bucket, Endpoint: b.Endpoint, Region: b.Region}
}

// keepsCredentials says that the cluster's credentials Secret stays as it is.
func (b *BackupStorage) keepsCredentials() bool {
	return b.AccessKeyID == "" && b.SecretAccessKey == ""
}

// Validate says which of the flags that external backup storage needs are missing.
func (b *BackupStorage) Validate() error {
	var missing []string
	if b.Bucket == "" {
		missing = append(missing, "--backup-storage-bucket")
	}
	if b.AccessKeyID == "" {
		missing = append(missing, "--backup-storage-access-key-id")
	}
	if b.SecretAccessKey == "" {
		missing = append(missing, "--backup-storage-secret-access-key-file (or KIP_BACKUP_SECRET_ACCESS_KEY)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("external backup storage needs %s", strings.Join(missing, ", "))
	}
	return nil
}

// Component is one thing kip install installs.
type Component struct {
	// Name is the component's name: kipper-crds, kipper-base, traefik, cert-manager, longhorn, dex,
	// zot, keda, minio, velero, prometheus, loki, console.
	Name string
	// Version is what kip records as installed: the pinned release, or kip's version for kip's own.
	Version string
	// Objects are server-side applied on every run (kube.Apply, field manager "kip").
	Objects []*unstructured.Unstructured
	// CreateOnly are created when missing and never changed afterwards.
	CreateOnly []*unstructured.Unstructured
	// After are applied once the component is ready: they need the chart's CRDs or objects.
	After []*unstructured.Unstructured
	// Namespaces are where the component's workloads run.
	Namespaces []string
}

// Components returns the components of a cluster with o's profile, storage, monitoring and
// backups, in install order. Secrets it generates (the console's OIDC client secret, the initial
// admin's password, MinIO's credentials) are new on every call; the objects holding them are
// arranged so that re-running install keeps the ones the cluster already has.
func Render(o Options) ([]Component, error) {
	r, err := newRenderer(o)
	if err != nil {
		return nil, fmt.Errorf("install components: %w", err)
	}
	steps := []func() (Component, error){r.kipperCRDs, r.kipperBase, r.traefik, r.certManager}
	if o.Sizing.Storage == cluster.StorageLonghorn {
		steps = append(steps, r.longhorn)
	}
	steps = append(steps, r.dex, r.zot, r.keda)
	switch mode, _ := BackupsOf(o); mode {
	case cluster.BackupsExternal:
		steps = append(steps, r.velero)
	case cluster.BackupsInCluster:
		// No external storage: backups go to MinIO on Longhorn. A local cluster gets no backups,
		// since a backup on the same disk would be lost with it.
		steps = append(steps, r.minio, r.velero)
	}
	if o.Monitoring.Prometheus {
		steps = append(steps, r.prometheus)
	}
	if o.Monitoring.Loki {
		steps = append(steps, r.loki)
	}
	steps = append(steps, r.console)

	out := make([]Component, 0, len(steps))
	for _, step := range steps {
		c, err := step()
		if err != nil {
			return nil, fmt.Errorf("install components: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}

// renderer builds the components of one Options.
type renderer struct {
	o Options
	// domain is the cluster's public domain: <ip>.sslip.io, or the server's DNS name.
	domain      string
	consoleHost string
	dexHost     string
	// dexConfig is ExistingDexConfig, parsed; nil on a fresh install.
	dexConfig map[string]any
}

func newRenderer(o Options) (*renderer, error) {
	if o.Pinned == nil {
		return nil, errors.New("no pinned versions")
	}
	if o.KipVersion == "" {
		return nil, errors.New("no kip version to record on the CRDs")
	}
	switch o.Sizing.Storage {
	case cluster.StorageLocal, cluster.StorageLonghorn:
	default:
		return nil, fmt.Errorf("unknown storage %q: choose local or longhorn", o.Sizing.Storage)
	}
	for name, kept := range o.Kept {
		if !keepable[name] {
			return nil, fmt.Errorf("%s cannot be kept at the release the cluster runs: only Longhorn and cert-manager can", name)
		}
		if kept != "" && !strings.HasPrefix(kept, "v") {
			return nil, fmt.Errorf("%s release %q is not written as v<version>", name, kept)
		}
	}
	p := o.Sizing.Profile
	if p.Name == "" {
		return nil, errors.New("no profile")
	}
	for _, q := range []struct{ what, v string }{{"registry size", p.RegistrySize}, {"console-api memory", p.ConsoleAPIMemory}} {
		if _, err := resource.ParseQuantity(q.v); err != nil {
			return nil, fmt.Errorf("profile %s: %s %q is not a quantity", p.Name, q.what, q.v)
		}
	}
	domain, err := publicDomain(o.ServerAddress)
	if err != nil {
		return nil, err
	}
	if o.AdminEmail != "" {
		if a, err := mail.ParseAddress(o.AdminEmail); err != nil || a.Address != o.AdminEmail {
			return nil, fmt.Errorf("admin email %q is not an email address", o.AdminEmail)
		}
	}
	if err := checkBackups(o.Backups); err != nil {
		return nil, err
	}
	r := &renderer{o: o, domain: domain, consoleHost: "console." + domain, dexHost: "dex." + domain}
	if o.ExistingDexConfig != nil {
		if r.dexConfig, err = parseDexConfig(o.ExistingDexConfig); err != nil {
			return nil, fmt.Errorf("existing dex config: %w", err)
		}
	}
	return r, nil
}

// publicDomain is <ip>.sslip.io for a server's IPv4 address, and the name itself for a DNS name.
func publicDomain(address string) (string, error) {
	if ip, err := netip.ParseAddr(address); err == nil {
		if !ip.Is4() {
			return "", fmt.Errorf("server address %q is not an IPv4 address or a DNS name: the console and Dex answer at console.<address>.sslip.io and dex.<address>.sslip.io", address)
		}
		return ip.String() + ".sslip.io", nil
	}
	if len(validation.IsDNS1123Subdomain(address)) > 0 || !strings.Contains(address, ".") {
		return "", fmt.Errorf("server address %q is not an IPv4 address or a DNS name", address)
	}
	return address, nil
}

// checkBackups checks external backup storage without ever naming its credentials or endpoint
// (which may carry credentials too).
func checkBackups(b *BackupStorage) error {
	if b == nil {
		return nil
	}
	switch {
	case b.Bucket == "":
		return errors.New("backup storage has no bucket")
	case (b.AccessKeyID == "") != (b.SecretAccessKey == ""):
		return errors.New("backup storage needs both an access key ID and a secret access key, or neither to keep the cluster's")
	}
	if b.Endpoint != "" {
		u, err := url.Parse(b.Endpoint)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
			return errors.New("backup storage endpoint is not an http(s) URL without credentials, such as https://s3.example.com")
		}
	}
	return nil
}

func (r *renderer) pin(name string) (manifests.Component, error) {
	pin, err := r.o.Pinned.Component(name)
	if kept := r.o.Kept[name]; err == nil && kept != "" {
		// The chart version is the release, written as the pinned one is (cert-manager's with
		// its v, Longhorn's without).
		chart := strings.TrimPrefix(kept, "v")
		if strings.HasPrefix(pin.ChartVersion, "v") {
			chart = "v" + chart
		}
		pin.Version, pin.ChartVersion = kept, chart
	}
	return pin, err
}

// --- kip's own objects -------------------------------------------------------------------------

// chartComponent is a component installed from the pinned chart of the same name into namespace.
// Its Objects are the namespace, extra and the HelmChart, which k3s's helm-controller installs as
// the release name.
func (r *renderer) chartComponent(name, namespace string, values map[string]any, extra ...func() (*unstructured.Unstructured, error)) (Component, error) {
	pin, err := r.pin(name)
	if err != nil {
		return Component{}, err
	}
	if pin.Chart == "" {
		return Component{}, fmt.Errorf("versions.yaml pins no chart for %s", name)
	}
	c := Component{Name: name, Version: pin.Version, Namespaces: []string{namespace}}
	if err := collect(&c.Objects, typed("v1", "Namespace", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})); err != nil {
		return Component{}, err
	}
	if err := collect(&c.Objects, extra...); err != nil {
		return Component{}, err
	}
	var content string
	if len(values) > 0 {
		b, err := yaml.Marshal(values)
		if err != nil {
			return Component{}, fmt.Errorf("%s chart values: %w", name, err)
		}
		content = string(b)
	}
	err = collect(&c.Objects, typed(helmv1.SchemeGroupVersion.String(), "HelmChart", &helmv1.HelmChart{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: HelmChartNamespace},
		Spec: helmv1.HelmChartSpec{
			Chart:           pin.Chart,
			Repo:            pin.Repo,
			Version:         pin.ChartVersion,
			TargetNamespace: namespace,
			ValuesContent:   content,
			// A failed install or upgrade is left for the operator: helm-controller's default,
			// reinstall, uninstalls the release first, deleting the volumes of the registry, MinIO
			// and Loki with it.
			FailurePolicy: helmv1.FailurePolicyAbort,
		},
	}))
	return c, err
}

// randomToken returns n random bytes, hex-encoded.
func randomToken(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate a secret: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// randomPassword returns n random letters and digits, easy to type from a terminal.
func randomPassword(n int) (string, error) {
	const alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	out := make([]byte, n)
	for i := range out {
		j, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", fmt.Errorf("generate a password: %w", err)
		}
		out[i] = alphabet[j.Int64()]
	}
	return string(out), nil
}

// --- objects -----------------------------------------------------------------------------------

// typed returns a function converting a typed object to an unstructured one of apiVersion and kind,
// without status or creation timestamps, labelled as kip's.
func typed(apiVersion, kind string, obj runtime.Object) func() (*unstructured.Unstructured, error) {
	return func() (*unstructured.Unstructured, error) {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, fmt.Errorf("convert %s: %w", kind, err)
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion(apiVersion)
		u.SetKind(kind)
		unstructured.RemoveNestedField(m, "status")
		unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(m, "spec", "template", "metadata", "creationTimestamp")
		if spec, ok := m["spec"].(map[string]any); ok && len(spec) == 0 {
			delete(m, "spec") // a Namespace's
		}
		return labelled(u), nil
	}
}

// collect appends the objects the functions make to dst, stopping at the first error.
func collect(dst *[]*unstructured.Unstructured, fns ...func() (*unstructured.Unstructured, error)) error {
	for _, fn := range fns {
		u, err := fn()
		if err != nil {
			return err
		}
		*dst = append(*dst, u)
	}
	return nil
}

// labelled adds kip's labels to u and returns it.
func labelled(u *unstructured.Unstructured) *unstructured.Unstructured {
	l := u.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[managedByLabel] = "kip"
	l[partOfLabel] = "kipper"
	u.SetLabels(l)
	return u
}

func withKipLabels(l map[string]string) map[string]string {
	out := map[string]string{managedByLabel: "kip", partOfLabel: "kipper"}
	for k, v := range l {
		out[k] = v
	}
	return out
}

func setAnnotation(u *unstructured.Unstructured, key, value string) {
	a := u.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	u.SetAnnotations(a)
}

// --- readiness ---------------------------------------------------------------------------------

// HelmCharts are k3s's HelmChart objects (helm.cattle.io/v1).
var HelmCharts = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}

// ReadRelease reads the release of component name (one Options.Kept may keep) the cluster runs,
// as kip last applied it: its HelmChart's chart version, v-prefixed; "" when the cluster has no
// HelmChart of that name.
func ReadRelease(ctx context.Context, cl *kube.Clients, name string) (string, error) {
	hc, err := cl.Dynamic.Resource(HelmCharts).Namespace(HelmChartNamespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the HelmChart of %s: %w", name, err)
	}
	v, _, err := unstructured.NestedString(hc.Object, "spec", "version")
	if err != nil || v == "" {
		return "", fmt.Errorf("the HelmChart of %s names no chart version (%v): kip cannot tell which release of it the cluster runs", name, err)
	}
	return "v" + strings.TrimPrefix(v, "v"), nil
}
