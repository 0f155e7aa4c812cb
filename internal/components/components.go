package components

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/mail"
	"net/netip"
	"net/url"
	"reflect"
	"sort"
	"strings"

	helmv1 "github.com/k3s-io/helm-controller/pkg/apis/helm.cattle.io/v1"
	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/crypto/bcrypt"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
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
	// kipVersionAnnotation on the App CRD records the kip that last wrote the Kipper schemas.
	kipVersionAnnotation = "kipper.run/kip-version"
	// configHashAnnotation on Dex's pods rolls them when the Dex config changes: the chart reads the
	// config from a Secret it does not watch.
	configHashAnnotation = "kipper.run/config-sha256"
	// helmReleaseAnnotation is how Helm marks the objects of a release.
	helmReleaseAnnotation = "meta.helm.sh/release-name"
)

// Namespaces and names.
const (
	systemNamespace    = "kipper-system"
	helmChartNamespace = "kube-system" // where k3s's helm-controller runs the helm-install Jobs
	longhornNamespace  = "longhorn-system"
	veleroNamespace    = "velero"
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

// Backups.
const (
	veleroCredentialsSecret = "velero-credentials"       // external storage, replaced on every run
	minioCredentialsSecret  = "velero-minio-credentials" // in-cluster MinIO, created once
	minioBucket             = "velero"
	minioRootUser           = "kipper-backups"
	defaultBackupRegion     = "us-east-1"
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
	// registryNodePort is where every node's containerd reaches the Zot registry.
	registryNodePort = 30500
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
	// Pinned are the versions this kip pins (manifests.Pinned).
	Pinned *manifests.Versions
	// KipVersion is this kip's version, recorded on the App CRD.
	KipVersion string
	// ExistingDexConfig is the cluster's current Dex config (ReadDexConfig) when install runs again
	// on a cluster; nil on a fresh install. Its static users are kept.
	ExistingDexConfig []byte
}

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
	return r.o.Pinned.Component(name)
}

// --- kip's own objects -------------------------------------------------------------------------

func (r *renderer) kipperCRDs() (Component, error) {
	docs, err := manifests.CRDs()
	if err != nil {
		return Component{}, err
	}
	c := Component{Name: "kipper-crds", Version: r.o.KipVersion}
	for _, doc := range docs {
		objs, err := kube.DecodeManifests(doc)
		if err != nil {
			return Component{}, fmt.Errorf("kipper CRDs: %w", err)
		}
		for _, obj := range objs {
			labelled(obj)
			if obj.GetName() == "apps.kipper.run" {
				setAnnotation(obj, kipVersionAnnotation, r.o.KipVersion)
			}
			c.Objects = append(c.Objects, obj)
		}
	}
	return c, nil
}

func (r *renderer) kipperBase() (Component, error) {
	c := Component{Name: "kipper-base", Version: r.o.KipVersion, Namespaces: []string{systemNamespace}}
	err := collect(&c.Objects,
		typed("v1", "Namespace", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace}}),
		typed("v1", "ServiceAccount", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace}}),
		typed("rbac.authorization.k8s.io/v1", "ClusterRole", &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kipper-console-api"},
			Rules:      consoleAPIRules(),
		}),
		typed("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kipper-console-api"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kipper-console-api"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "console-api", Namespace: systemNamespace}},
		}),
	)
	if err != nil {
		return Component{}, err
	}
	if r.o.AdminEmail != "" {
		// The API server knows an operator by the email claim of their Dex login.
		err := collect(&c.CreateOnly, typed("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: initialAdminBinding},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: operatorPrefix + r.o.AdminEmail}},
		}))
		if err != nil {
			return Component{}, err
		}
	}
	return c, nil
}

// consoleAPIRules is what console-api may do: run the projects' apps, services, functions and
// builds, and read what the console shows.
func consoleAPIRules() []rbacv1.PolicyRule {
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"kipper.run"}, Resources: []string{"*"}, Verbs: all},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "pods/log", "pods/exec", "services", "endpoints",
			"configmaps", "secrets", "persistentvolumeclaims", "serviceaccounts", "resourcequotas", "limitranges", "events"}, Verbs: all},
		{APIGroups: []string{""}, Resources: []string{"nodes", "persistentvolumes"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/scale", "statefulsets", "statefulsets/scale", "replicasets", "daemonsets"}, Verbs: all},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: all},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses", "networkpolicies"}, Verbs: all},
		{APIGroups: []string{"autoscaling"}, Resources: []string{"horizontalpodautoscalers"}, Verbs: all},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: all},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: all},
		{APIGroups: []string{"keda.sh", "http.keda.sh"}, Resources: []string{"*"}, Verbs: all},
		{APIGroups: []string{"traefik.io"}, Resources: []string{"middlewares", "ingressroutes", "tlsstores", "tlsoptions"}, Verbs: all},
		{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates", "issuers"}, Verbs: all},
		{APIGroups: []string{"velero.io"}, Resources: []string{"backups", "restores", "schedules", "backupstoragelocations", "deletebackuprequests"}, Verbs: all},
		{APIGroups: []string{"helm.cattle.io"}, Resources: []string{"helmcharts"}, Verbs: all},
		{APIGroups: []string{"monitoring.coreos.com"}, Resources: []string{"servicemonitors", "podmonitors"}, Verbs: all},
		{APIGroups: []string{"longhorn.io"}, Resources: []string{"volumes", "replicas", "nodes", "settings"}, Verbs: read},
		{APIGroups: []string{"metrics.k8s.io"}, Resources: []string{"pods", "nodes"}, Verbs: read},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: read},
	}
}

// console is the console and console-api, reached at https://console.<ip>.sslip.io.
func (r *renderer) console() (Component, error) {
	api, err := r.pin("console-api")
	if err != nil {
		return Component{}, err
	}
	ui, err := r.pin("console")
	if err != nil {
		return Component{}, err
	}
	memory := resource.MustParse(r.o.Sizing.Profile.ConsoleAPIMemory) // newRenderer checked it
	c := Component{Name: "console", Version: api.Version, Namespaces: []string{systemNamespace}}
	apiLabels := map[string]string{"app": "console-api"}
	uiLabels := map[string]string{"app": "console"}
	env := []corev1.EnvVar{
		{Name: "DEX_ISSUER", Value: "https://" + r.dexHost},
		{Name: "DEX_CLIENT_ID", Value: consoleClientID},
		{Name: "DEX_CLIENT_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: dexOIDCClientSecret}, Key: "secret"}}},
		{Name: "DEX_REDIRECT_URI", Value: "https://" + r.consoleHost + "/callback"},
		{Name: "CLUSTER_HOST", Value: r.o.ServerAddress},
		{Name: "CLUSTER_DOMAIN", Value: r.domain},
		{Name: "CONSOLE_DOMAIN", Value: r.consoleHost},
		{Name: "DEX_DOMAIN", Value: r.dexHost},
	}
	err = collect(&c.Objects,
		typed("apps/v1", "Deployment", &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: apiLabels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: withKipLabels(apiLabels)},
					Spec: corev1.PodSpec{
						ServiceAccountName: "console-api",
						// console-api holds a powerful ServiceAccount, so its own pod is locked down.
						SecurityContext: &corev1.PodSecurityContext{
							RunAsNonRoot:   ptr.To(true),
							RunAsUser:      ptr.To[int64](65532),
							RunAsGroup:     ptr.To[int64](65532),
							FSGroup:        ptr.To[int64](65532),
							SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
						Containers: []corev1.Container{{
							Name:            "console-api",
							Image:           api.Image + ":" + api.Version,
							ImagePullPolicy: corev1.PullAlways,
							Ports: []corev1.ContainerPort{
								{Name: "http", ContainerPort: consoleAPIPort},
								{Name: "metrics", ContainerPort: consoleAPIMetricsPort},
							},
							Env: env,
							Resources: corev1.ResourceRequirements{
								Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: memory},
								Limits:   corev1.ResourceList{corev1.ResourceMemory: memory},
							},
							SecurityContext: &corev1.SecurityContext{
								RunAsNonRoot:             ptr.To(true),
								AllowPrivilegeEscalation: ptr.To(false),
								ReadOnlyRootFilesystem:   ptr.To(true),
								Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
								SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
							},
							// The root filesystem is read-only: /tmp is the one writable place.
							VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
						}},
						Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					},
				},
			},
		}),
		typed("v1", "Service", &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace},
			Spec: corev1.ServiceSpec{Selector: apiLabels, Ports: []corev1.ServicePort{
				{Name: "http", Port: consoleAPIPort, TargetPort: intstr.FromString("http")},
				{Name: "metrics", Port: consoleAPIMetricsPort, TargetPort: intstr.FromString("metrics")},
			}},
		}),
		typed("apps/v1", "Deployment", &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: uiLabels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: withKipLabels(uiLabels)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name:            "console",
						Image:           ui.Image + ":" + ui.Version,
						ImagePullPolicy: corev1.PullAlways,
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: consolePort}},
					}}},
				},
			},
		}),
		typed("v1", "Service", &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace},
			Spec: corev1.ServiceSpec{Selector: uiLabels, Ports: []corev1.ServicePort{
				{Name: "http", Port: consolePort, TargetPort: intstr.FromString("http")},
			}},
		}),
		typed("networking.k8s.io/v1", "Ingress", &networkingv1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace,
				Annotations: map[string]string{"cert-manager.io/cluster-issuer": clusterIssuer}},
			Spec: networkingv1.IngressSpec{
				IngressClassName: ptr.To(ingressClass),
				TLS:              []networkingv1.IngressTLS{{Hosts: []string{r.consoleHost}, SecretName: "console-tls"}},
				Rules: []networkingv1.IngressRule{{Host: r.consoleHost, IngressRuleValue: networkingv1.IngressRuleValue{
					HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
						ingressPath("/api", "console-api", consoleAPIPort),
						ingressPath("/auth", "console-api", consoleAPIPort),
						ingressPath("/", "console", consolePort),
					}},
				}}},
			},
		}),
	)
	return c, err
}

func ingressPath(path, service string, port int32) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{
		Path:     path,
		PathType: ptr.To(networkingv1.PathTypePrefix),
		Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
			Name: service, Port: networkingv1.ServiceBackendPort{Number: port}}},
	}
}

// --- charts ------------------------------------------------------------------------------------

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
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: helmChartNamespace},
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

func (r *renderer) traefik() (Component, error) {
	return r.chartComponent("traefik", "traefik", map[string]any{
		"ingressClass": map[string]any{"enabled": true, "isDefaultClass": true, "name": ingressClass},
		// k3s's ServiceLB publishes the LoadBalancer Service on every node's ports 80 and 443.
		"service": map[string]any{"spec": map[string]any{"type": "LoadBalancer"}},
	})
}

func (r *renderer) certManager() (Component, error) {
	c, err := r.chartComponent("cert-manager", "cert-manager", map[string]any{
		"crds": map[string]any{"enabled": true, "keep": true},
	})
	if err != nil {
		return Component{}, err
	}
	// The console's and Dex's certificates come from Let's Encrypt over HTTP-01 through Traefik.
	acme := map[string]any{
		"server":              "https://acme-v02.api.letsencrypt.org/directory",
		"privateKeySecretRef": map[string]any{"name": "letsencrypt-account-key"},
		"solvers":             []any{map[string]any{"http01": map[string]any{"ingress": map[string]any{"ingressClassName": ingressClass}}}},
	}
	if r.o.AdminEmail != "" {
		acme["email"] = r.o.AdminEmail
	}
	issuer := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1",
		"kind":       "ClusterIssuer",
		"metadata":   map[string]any{"name": clusterIssuer},
		"spec":       map[string]any{"acme": acme},
	}}
	c.After = append(c.After, labelled(issuer))
	return c, nil
}

// longhornSettings are the settings kip pins on every Longhorn cluster, by their names in
// longhorn-manager's types/setting.go, with the values the chart's defaultSettings take.
var longhornSettings = []struct {
	name, chartKey string
	value          any
}{
	{"upgrade-checker", "upgradeChecker", false},
	{"allow-collecting-longhorn-usage-metrics", "allowCollectingLonghornUsageMetrics", false},
	// Longhorn issue 14096. A plain "false" applies to both data engines.
	{"fast-replica-rebuild-enabled", "fastReplicaRebuildEnabled", false},
	// A drain waits while Longhorn moves a volume's last healthy copy off the node.
	{"node-drain-policy", "nodeDrainPolicy", "block-for-eviction-if-contains-last-replica"},
	{"default-data-locality", "defaultDataLocality", "disabled"},
	{"replica-auto-balance", "replicaAutoBalance", "disabled"},
	{"rwx-volume-fast-failover", "rwxVolumeFastFailover", false},
	// Pods on a node that goes down are left in place.
	{"node-down-pod-deletion-policy", "nodeDownPodDeletionPolicy", "do-nothing"},
	// A single-node cluster creates volumes that want more copies than it has nodes.
	{"allow-volume-creation-with-degraded-availability", "allowVolumeCreationWithDegradedAvailability", true},
}

func (r *renderer) longhorn() (Component, error) {
	defaults := map[string]any{}
	for _, s := range longhornSettings {
		defaults[s.chartKey] = s.value
	}
	// No backup target, ever: backups go through Velero.
	c, err := r.chartComponent("longhorn", longhornNamespace, map[string]any{
		"defaultSettings": defaults,
		"persistence":     map[string]any{"defaultClass": false},
	})
	if err != nil {
		return Component{}, err
	}
	for _, s := range longhornSettings {
		err := collect(&c.After, typed("longhorn.io/v1beta2", "Setting", &longhornv1beta2.Setting{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: longhornNamespace},
			Value:      fmt.Sprint(s.value),
		}))
		if err != nil {
			return Component{}, err
		}
	}
	// Longhorn's stock class is not the default: k3s's local-path stays the only default class. The
	// class is Longhorn's (its manager creates it); kip only sets the annotation.
	class := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "storage.k8s.io/v1",
		"kind":       "StorageClass",
		"metadata": map[string]any{
			"name":        longhornClass,
			"annotations": map[string]any{"storageclass.kubernetes.io/is-default-class": "false"},
		},
	}}
	c.After = append(c.After, labelled(class))
	return c, nil
}

func (r *renderer) zot() (Component, error) {
	config := map[string]any{
		"storage": map[string]any{"rootDirectory": "/var/lib/registry", "gc": true, "dedupe": true},
		"http":    map[string]any{"address": "0.0.0.0", "port": "5000"},
		"log":     map[string]any{"level": "info"},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return Component{}, fmt.Errorf("zot config: %w", err)
	}
	return r.chartComponent("zot", "zot", map[string]any{
		"persistence": true,
		"pvc": map[string]any{
			"create":           true,
			"storage":          r.o.Sizing.Profile.RegistrySize,
			"storageClassName": localPathClass,
		},
		"mountConfig": true,
		"configFiles": map[string]any{"config.json": string(configJSON)},
		"service":     map[string]any{"type": "NodePort", "nodePort": registryNodePort},
	})
}

func (r *renderer) keda() (Component, error) {
	return r.chartComponent("keda", "keda", nil)
}

// minio is in-cluster backup storage on a Longhorn cluster without external storage: MinIO on a
// Longhorn volume, in Velero's namespace so that both read the credentials kip generates once.
// (The platform's other volumes, the registry's, Prometheus's and Loki's, stay on the server's
// disk in k3s's local-path class whatever the cluster's storage.)
func (r *renderer) minio() (Component, error) {
	c, err := r.chartComponent("minio", veleroNamespace, map[string]any{
		"mode":           "standalone",
		"replicas":       1,
		"existingSecret": minioCredentialsSecret,
		"persistence":    map[string]any{"enabled": true, "size": minioVolumeSize, "storageClass": longhornClass},
		"resources":      map[string]any{"requests": map[string]any{"memory": "256Mi"}},
		// The chart's default adds a user with a well-known password.
		"users":   []any{},
		"buckets": []any{map[string]any{"name": minioBucket, "policy": "none", "purge": false}},
	})
	if err != nil {
		return Component{}, err
	}
	password, err := randomToken(24)
	if err != nil {
		return Component{}, err
	}
	err = collect(&c.CreateOnly, typed("v1", "Secret", &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: minioCredentialsSecret, Namespace: veleroNamespace},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"rootUser":     []byte(minioRootUser),
			"rootPassword": []byte(password),
			"cloud":        awsCredentials(minioRootUser, password),
		},
	}))
	return c, err
}

// velero backs up to the external storage when there is one, else to in-cluster MinIO.
func (r *renderer) velero() (Component, error) {
	plugin, err := r.pin("velero-plugin-for-aws")
	if err != nil {
		return Component{}, err
	}
	pin, err := r.pin("velero")
	if err != nil {
		return Component{}, err
	}
	location := map[string]any{
		"name":     "default",
		"provider": "aws",
		"default":  true,
	}
	credentials := minioCredentialsSecret
	var extra []func() (*unstructured.Unstructured, error)
	if b := r.o.Backups; b != nil {
		region := b.Region
		if region == "" {
			region = defaultBackupRegion
		}
		config := map[string]any{"region": region}
		if b.Endpoint != "" {
			config["s3Url"] = b.Endpoint
			config["s3ForcePathStyle"] = "true"
		}
		location["bucket"] = b.Bucket
		location["config"] = config
		credentials = veleroCredentialsSecret
		// Replaced on every run that gives them: re-running install is how operators rotate
		// backup keys. Without them the cluster's Secret stays.
		if !b.keepsCredentials() {
			extra = append(extra, typed("v1", "Secret", &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: veleroCredentialsSecret, Namespace: veleroNamespace},
				Type:       corev1.SecretTypeOpaque,
				Data:       map[string][]byte{"cloud": awsCredentials(b.AccessKeyID, b.SecretAccessKey)},
			}))
		}
	} else {
		location["bucket"] = minioBucket
		location["config"] = map[string]any{
			"region":           "minio",
			"s3Url":            "http://minio." + veleroNamespace + ".svc:9000",
			"s3ForcePathStyle": "true",
		}
	}
	return r.chartComponent("velero", veleroNamespace, map[string]any{
		"image": map[string]any{"repository": pin.Image, "tag": pin.Version},
		"initContainers": []any{map[string]any{
			"name":            "velero-plugin-for-aws",
			"image":           plugin.Image + ":" + plugin.Version,
			"imagePullPolicy": "IfNotPresent",
			"volumeMounts":    []any{map[string]any{"mountPath": "/target", "name": "plugins"}},
		}},
		"credentials": map[string]any{"useSecret": true, "existingSecret": credentials},
		"configuration": map[string]any{
			"backupStorageLocation":    []any{location},
			"volumeSnapshotLocation":   []any{},
			"uploaderType":             "kopia",
			"defaultVolumesToFsBackup": true,
		},
		// File-system backups of every volume, through the node agent.
		"deployNodeAgent":  true,
		"snapshotsEnabled": false,
	}, extra...)
}

func (r *renderer) prometheus() (Component, error) {
	grafana := map[string]any{"enabled": true}
	if r.o.Monitoring.Loki {
		grafana["additionalDataSources"] = []any{map[string]any{
			"name": "Loki", "type": "loki", "access": "proxy", "url": "http://loki.loki.svc:3100",
		}}
	}
	return r.chartComponent("prometheus", "monitoring", map[string]any{
		// Nothing routes alerts yet.
		"alertmanager": map[string]any{"enabled": false},
		"grafana":      grafana,
		// k3s runs these inside its own process, where they cannot be scraped.
		"kubeEtcd":              map[string]any{"enabled": false},
		"kubeControllerManager": map[string]any{"enabled": false},
		"kubeScheduler":         map[string]any{"enabled": false},
		"kubeProxy":             map[string]any{"enabled": false},
		// kube-state-metrics rebuilds its view of every object whenever the API server returns;
		// 64Mi OOM-killed it in that burst.
		"kube-state-metrics": map[string]any{"resources": map[string]any{
			"requests": map[string]any{"cpu": "10m", "memory": "64Mi"},
			"limits":   map[string]any{"memory": "256Mi"},
		}},
		"prometheus": map[string]any{"prometheusSpec": map[string]any{
			"retention":     retention(r.o.Sizing.Profile.PrometheusRetention, func(p cluster.Profile) string { return p.PrometheusRetention }),
			"retentionSize": prometheusMaxTSDB,
			"storageSpec": map[string]any{"volumeClaimTemplate": map[string]any{"spec": map[string]any{
				"storageClassName": localPathClass,
				"accessModes":      []any{"ReadWriteOnce"},
				"resources":        map[string]any{"requests": map[string]any{"storage": prometheusVolumeSize}},
			}}},
			// Scrape the ServiceMonitors of every release, not only this chart's.
			"serviceMonitorSelectorNilUsesHelmValues": false,
			"podMonitorSelectorNilUsesHelmValues":     false,
		}},
	})
}

func (r *renderer) loki() (Component, error) {
	// Loki has its own namespace: Prometheus's operator makes workloads in monitoring that no Helm
	// release marks, which Loki's readiness would otherwise wait for.
	return r.chartComponent("loki", "loki", map[string]any{
		"deploymentMode": "SingleBinary",
		"loki": map[string]any{
			"auth_enabled": false,
			"commonConfig": map[string]any{"replication_factor": 1},
			"storage":      map[string]any{"type": "filesystem"},
			"schemaConfig": map[string]any{"configs": []any{map[string]any{
				"from": "2024-04-01", "store": "tsdb", "object_store": "filesystem", "schema": "v13",
				"index": map[string]any{"prefix": "index_", "period": "24h"},
			}}},
			"limits_config": map[string]any{"retention_period": retention(r.o.Sizing.Profile.LokiRetention, func(p cluster.Profile) string { return p.LokiRetention })},
			"compactor":     map[string]any{"retention_enabled": true, "delete_request_store": "filesystem"},
		},
		"singleBinary": map[string]any{
			"replicas":    1,
			"persistence": map[string]any{"size": lokiVolumeSize, "storageClass": localPathClass},
		},
		"read":         map[string]any{"replicas": 0},
		"write":        map[string]any{"replicas": 0},
		"backend":      map[string]any{"replicas": 0},
		"gateway":      map[string]any{"enabled": false},
		"chunksCache":  map[string]any{"enabled": false},
		"resultsCache": map[string]any{"enabled": false},
		"lokiCanary":   map[string]any{"enabled": false},
		"test":         map[string]any{"enabled": false},
	})
}

// retention is the profile's retention, or, on a profile that keeps no monitoring (nano, where
// it is turned on later), the shortest one a profile keeps.
func retention(v string, of func(cluster.Profile) string) string {
	if v != "" {
		return v
	}
	for _, p := range cluster.Profiles {
		if of(p) != "" {
			return of(p)
		}
	}
	return ""
}

// awsCredentials is the credentials file Velero's AWS plugin reads.
func awsCredentials(id, secret string) []byte {
	return []byte("[default]\naws_access_key_id=" + id + "\naws_secret_access_key=" + secret + "\n")
}

// --- Dex ---------------------------------------------------------------------------------------

// dex is Dex, at https://dex.<ip>.sslip.io: the console's and kip's login. Its config keeps the
// static users of ExistingDexConfig (those the console added) and the console's client secret, and
// adds the initial admin when the config does not know that email yet.
func (r *renderer) dex() (Component, error) {
	clientSecret := existingClientSecret(r.dexConfig, consoleClientID)
	if clientSecret == "" {
		var err error
		if clientSecret, err = randomToken(32); err != nil {
			return Component{}, err
		}
	}
	users := existingUsers(r.dexConfig)
	if r.o.AdminEmail != "" && !hasUser(users, r.o.AdminEmail) {
		if usesHashFromEnv(users, adminHashEnv) {
			// The first admin's password hash comes from the environment; a second admin given
			// the same way would log in with the first one's password.
			return Component{}, fmt.Errorf("the console already has its first admin: add %s in the console instead", r.o.AdminEmail)
		}
		id, err := randomToken(16)
		if err != nil {
			return Component{}, err
		}
		users = append(users, map[string]any{
			"email":       r.o.AdminEmail,
			"username":    strings.SplitN(r.o.AdminEmail, "@", 2)[0],
			"userID":      id,
			"hashFromEnv": adminHashEnv,
		})
	}
	config := map[string]any{
		"issuer":  "https://" + r.dexHost,
		"storage": map[string]any{"type": "kubernetes", "config": map[string]any{"inCluster": true}},
		"web":     map[string]any{"http": "0.0.0.0:5556"},
		// ID tokens are short-lived: the API server accepts them as credentials and a bearer token
		// cannot be revoked; the console and kip renew through rotating refresh tokens.
		"expiry": map[string]any{
			"idTokens":     "15m",
			"authRequests": "10m",
			"refreshTokens": map[string]any{
				"reuseInterval":     "30s",
				"validIfNotUsedFor": "168h",
				"absoluteLifetime":  "720h",
			},
		},
		"oauth2":           map[string]any{"skipApprovalScreen": true},
		"enablePasswordDB": true,
		"staticPasswords":  users,
		"staticClients": []any{
			map[string]any{
				"id": consoleClientID, "name": "Kipper Console", "secret": clientSecret,
				"redirectURIs": []any{"https://" + r.consoleHost + "/callback"},
			},
			// A public client without redirect URIs: Dex lets it return to any loopback port, and
			// use the device flow.
			map[string]any{"id": cliClientID, "name": "kip", "public": true},
		},
	}
	configYAML, err := yaml.Marshal(config)
	if err != nil {
		return Component{}, fmt.Errorf("render dex config: %w", err)
	}
	sum := sha256.Sum256(configYAML)
	values := map[string]any{
		"configSecret":   map[string]any{"create": false, "name": dexConfigSecret},
		"podAnnotations": map[string]any{configHashAnnotation: hex.EncodeToString(sum[:])},
		"ingress": map[string]any{
			"enabled":     true,
			"className":   ingressClass,
			"annotations": map[string]any{"cert-manager.io/cluster-issuer": clusterIssuer},
			"hosts": []any{map[string]any{"host": r.dexHost, "paths": []any{
				map[string]any{"path": "/", "pathType": "Prefix"},
			}}},
			"tls": []any{map[string]any{"secretName": "dex-tls", "hosts": []any{r.dexHost}}},
		},
	}
	// A user whose hash comes from the environment takes it from the admin password Secret, which
	// kip creates once: its password and the hash Dex checks always match.
	adminFromEnv := usesHashFromEnv(users, adminHashEnv)
	if adminFromEnv {
		values["envVars"] = []any{map[string]any{
			"name": adminHashEnv,
			"valueFrom": map[string]any{"secretKeyRef": map[string]any{
				"name": adminPasswordSecret, "key": "hash",
			}},
		}}
	}
	c, err := r.chartComponent("dex", dexNamespace, values,
		typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: dexConfigSecret, Namespace: dexNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{dexConfigKey: configYAML},
		}),
		// console-api's copy of its client secret (kipper-base makes kipper-system).
		typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: dexOIDCClientSecret, Namespace: systemNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"secret": []byte(clientSecret)},
		}),
	)
	if err != nil {
		return Component{}, err
	}
	if adminFromEnv && r.o.AdminEmail != "" {
		password, err := randomPassword(20)
		if err != nil {
			return Component{}, err
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
		if err != nil {
			return Component{}, fmt.Errorf("hash the admin password: %w", err)
		}
		err = collect(&c.CreateOnly, typed("v1", "Secret", &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: adminPasswordSecret, Namespace: dexNamespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"email": []byte(r.o.AdminEmail), "password": []byte(password), "hash": hash},
		}))
		if err != nil {
			return Component{}, err
		}
	}
	return c, nil
}

// ReadDexConfig returns the Dex config kip rendered into the cluster (config.yaml of the Secret
// dex/dex-config), or nil when there is none yet.
func ReadDexConfig(ctx context.Context, cl *kube.Clients) ([]byte, error) {
	s, err := cl.Kube.CoreV1().Secrets(dexNamespace).Get(ctx, dexConfigSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the dex config: %w", err)
	}
	config, ok := s.Data[dexConfigKey]
	if !ok {
		return nil, fmt.Errorf("read the dex config: Secret %s/%s has no %s", dexNamespace, dexConfigSecret, dexConfigKey)
	}
	return config, nil
}

// DexUsers returns the emails of the static users (staticPasswords) of a Dex config, in order.
func DexUsers(config []byte) ([]string, error) {
	m, err := parseDexConfig(config)
	if err != nil {
		return nil, fmt.Errorf("dex users: %w", err)
	}
	var emails []string
	for _, u := range existingUsers(m) {
		if e, _ := u["email"].(string); e != "" {
			emails = append(emails, e)
		}
	}
	return emails, nil
}

// parseDexConfig reads a Dex config loosely: only its static users and clients matter here. Its
// errors never quote the config, which holds password hashes and a client secret.
func parseDexConfig(config []byte) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal(config, &m); err != nil {
		return nil, errors.New("not a YAML document")
	}
	if m == nil {
		return nil, errors.New("empty")
	}
	for _, key := range []string{"staticPasswords", "staticClients"} {
		v, ok := m[key]
		if !ok || v == nil {
			continue
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("%s is not a list", key)
		}
		for i, it := range list {
			if _, ok := it.(map[string]any); !ok {
				return nil, fmt.Errorf("%s entry %d is not a mapping", key, i+1)
			}
		}
	}
	return m, nil
}

func existingUsers(config map[string]any) []map[string]any {
	list, _ := config["staticPasswords"].([]any)
	users := make([]map[string]any, 0, len(list))
	for _, it := range list {
		users = append(users, it.(map[string]any)) // parseDexConfig checked the type
	}
	return users
}

func existingClientSecret(config map[string]any, id string) string {
	list, _ := config["staticClients"].([]any)
	for _, it := range list {
		c := it.(map[string]any)
		if c["id"] == id {
			s, _ := c["secret"].(string)
			return s
		}
	}
	return ""
}

func hasUser(users []map[string]any, email string) bool {
	for _, u := range users {
		if e, _ := u["email"].(string); strings.EqualFold(e, email) {
			return true
		}
	}
	return false
}

func usesHashFromEnv(users []map[string]any, env string) bool {
	for _, u := range users {
		if u["hashFromEnv"] == env {
			return true
		}
	}
	return false
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

var (
	helmChartGK = schema.GroupKind{Group: helmv1.SchemeGroupVersion.Group, Kind: "HelmChart"}
	crdGK       = schema.GroupKind{Group: apiextensionsv1.GroupName, Kind: "CustomResourceDefinition"}
)

// Status reports whether c is installed and rolled out, and when it is not, what is pending:
//   - for each HelmChart among Objects, k3s's helm-controller's Job helm-install-<name> in the
//     chart's namespace exists, installs the chart's spec.version (its VERSION) and is Complete
//     (a Failed Job is not ready, and pending says why);
//   - CRDs among Objects are Established;
//   - kip's own Deployments, DaemonSets and StatefulSets among Objects have rolled out;
//   - for a chart component, every Deployment, DaemonSet and StatefulSet in Namespaces has rolled
//     out, except those of another Helm release (MinIO's in Velero's namespace);
//   - After objects are present as rendered.
//
// An error is an API error other than not-found, or a rollout that waiting cannot finish.
func (c Component) Status(ctx context.Context, cl *kube.Clients) (ready bool, pending string, err error) {
	return c.StatusFrom(ReadListed(ctx, cl, []Component{c}))
}

func isWorkloadKind(kind string) bool {
	return kind == "Deployment" || kind == "DaemonSet" || kind == "StatefulSet"
}

func jobEnv(job *batchv1.Job, name string) string {
	for _, c := range job.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

// firstDifference returns the path of the first field of want that live lacks or holds
// differently, or "". Lists must have want's length, and their items want's fields.
func firstDifference(want, live any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return orRoot(path)
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if d := firstDifference(w[k], l[k], path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		l, ok := live.([]any)
		if !ok || len(l) != len(w) {
			return orRoot(path)
		}
		for i := range w {
			if d := firstDifference(w[i], l[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(want, live) {
			return orRoot(path)
		}
		return ""
	}
}

func orRoot(path string) string {
	if path == "" {
		return "."
	}
	return path
}
