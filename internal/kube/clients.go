// Package kube is kip's side of the Kubernetes API: clients, server-side apply, waits, records
// (annotations) and the cluster lock.
package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	longhornclientset "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/homedir"

	"kipper.run/kip/internal/buildinfo"
	"kipper.run/kip/internal/fault"
)

// Scheme knows the typed objects kip converts unstructured ones to and from: Kubernetes' built-in
// types, CustomResourceDefinitions, Velero v1 and Longhorn v1beta2. Use it with
// runtime.DefaultUnstructuredConverter or Scheme().Convert. It is built on first use, so that
// commands which never convert (kip version, --help) do not pay for it at start-up.
var Scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(velerov1.AddToScheme(s))
	utilruntime.Must(longhornv1beta2.AddToScheme(s))
	return s
})

// Clients are the API clients of one cluster, sharing one HTTP connection pool. Building them
// makes no request: the first call does.
type Clients struct {
	Config   *rest.Config
	Kube     kubernetes.Interface
	Dynamic  dynamic.Interface
	APIExt   apiextensionsclientset.Interface
	Longhorn longhornclientset.Interface
	// Mapper maps kinds to resources through discovery, fetched on first use and cached; Apply
	// resets it when a kind is unknown (a CRD it just installed).
	Mapper meta.RESTMapper
	// Metadata reads and patches objects as their metadata alone (PartialObjectMetadata): how
	// kip reads the Secrets whose data it must never receive (package credential).
	Metadata metadata.Interface
}

// NewClients builds the clients for cfg. A copy of cfg is kept; when it has no user agent it
// gets kip/<version> (<os>/<arch>), and when it has no rate limits it gets kubectl's (QPS 50,
// burst 300) so that applying a bundle is not throttled. A test build counts the clients' writes
// (package fault).
func NewClients(cfg *rest.Config) (*Clients, error) {
	if cfg == nil {
		return nil, errors.New("build api clients: no rest config")
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = userAgent()
	}
	if cfg.QPS == 0 {
		cfg.QPS = 50
	}
	if cfg.Burst == 0 {
		cfg.Burst = 300
	}
	fault.WrapConfig(cfg)
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("build api clients: %w", err)
	}
	c := &Clients{Config: cfg}
	if c.Kube, err = kubernetes.NewForConfigAndClient(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("build kubernetes client: %w", err)
	}
	if c.Dynamic, err = dynamic.NewForConfigAndClient(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("build dynamic client: %w", err)
	}
	if c.Metadata, err = metadata.NewForConfigAndClient(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("build metadata client: %w", err)
	}
	if c.APIExt, err = apiextensionsclientset.NewForConfigAndClient(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("build apiextensions client: %w", err)
	}
	if c.Longhorn, err = longhornclientset.NewForConfigAndClient(cfg, httpClient); err != nil {
		return nil, fmt.Errorf("build longhorn client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("build discovery client: %w", err)
	}
	c.Mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return c, nil
}

// userAgent is kip/<version> (<os>/<arch>), the version the build stamped into buildinfo.
func userAgent() string {
	return fmt.Sprintf("kip/%s (%s/%s)", buildinfo.Version, goruntime.GOOS, goruntime.GOARCH)
}

// LoadConfig loads a client configuration the way kubectl does: kubeconfigPath when given (it
// must exist), else the files in $KUBECONFIG, else ~/.kube/config. context selects a context
// other than the current one.
func LoadConfig(kubeconfigPath, context string) (*rest.Config, error) {
	rules := &clientcmd.ClientConfigLoadingRules{}
	var looked string
	switch {
	case kubeconfigPath != "":
		if _, err := os.Stat(kubeconfigPath); err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		rules.ExplicitPath = kubeconfigPath
		looked = kubeconfigPath
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
		rules.Precedence = filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar))
		looked = "$KUBECONFIG (" + strings.Join(rules.Precedence, ", ") + ")"
	default:
		home := filepath.Join(homedir.HomeDir(), clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
		rules.Precedence = []string{home}
		looked = home
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	raw, err := loader.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", looked, err)
	}
	if len(raw.Contexts) == 0 && len(raw.Clusters) == 0 {
		return nil, fmt.Errorf("no kubeconfig found: looked in %s; pass --kubeconfig or set KUBECONFIG", looked)
	}
	if context != "" {
		if _, ok := raw.Contexts[context]; !ok {
			return nil, fmt.Errorf("load kubeconfig %s: no context %q (contexts: %s)", looked, context, contextNames(raw.Contexts))
		}
	}
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", looked, err)
	}
	return cfg, nil
}

func contextNames[V any](m map[string]V) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
