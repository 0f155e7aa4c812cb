package components

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestStatusFromLists judges every component of a small and of the largest set from one
// ReadListed, with CRDs, Jobs, workloads and After objects in various states, from a number of
// list requests that does not grow with the components. (Component.Status is StatusFrom on one
// component's lists, so TestComponentStatus checks the rules themselves.)
func TestStatusFromLists(t *testing.T) {
	env, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := env.AddNode(t, "statusfrom-node", testenv.NodeOptions{})

	small := renderComponents(t, testOptions(t, "nano", cluster.StorageLocal))
	o := testOptions(t, "large", cluster.StorageLonghorn)
	o.Backups = &BackupStorage{Bucket: "backups", Endpoint: "https://s3.example.com", AccessKeyID: "id", SecretAccessKey: "key"}
	large := renderComponents(t, o)

	// kip's CRDs and the console, applied; traefik's Job at another version, dex's at its own
	// (kwok completes it), the rest not created; Longhorn's After objects without their CRD's
	// chart, so some applied and some not.
	for _, name := range []string{"kipper-crds", "kipper-base", "console"} {
		if err := kube.Apply(ctx, cl, componentNamed(t, small, name).Objects, kube.ApplyOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	dexChart := findObject(t, componentNamed(t, small, "dex").Objects, "HelmChart", "kube-system", "dex")
	dexVersion, _, _ := unstructured.NestedString(dexChart.Object, "spec", "version")
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("traefik", "0.0.1", node.Name))
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("dex", dexVersion, node.Name))
	t.Cleanup(func() {
		deleteHelmJob(context.Background(), t, cl, "helm-install-traefik")
		deleteHelmJob(context.Background(), t, cl, "helm-install-dex")
	})
	lh := componentNamed(t, large, "longhorn")
	var settings []*unstructured.Unstructured
	for _, a := range lh.After {
		if a.GetKind() == "Setting" && len(settings) < 2 {
			settings = append(settings, a)
		}
	}
	if err := kube.Apply(ctx, cl, append(lh.Objects, settings...), kube.ApplyOptions{Force: true}); err != nil {
		t.Fatal(err)
	}

	// Counted clients: ReadListed's requests do not grow with the components.
	var requests atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			requests.Add(1)
			return rt.RoundTrip(req)
		})
	}
	counted, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, set := range []struct {
		name  string
		comps []Component
	}{{"nano", small}, {"large", large}} {
		requests.Store(0)
		l := ReadListed(ctx, counted, set.comps)
		// Jobs of one namespace, kip's CRDs, three kinds of workload, discovery (twice when a
		// kind is not served yet) and one list per kind and namespace of After objects.
		if n := requests.Load(); n > 12 {
			t.Errorf("%s: ReadListed made %d requests", set.name, n)
		}
		for _, c := range set.comps {
			ready, pending, err := c.StatusFrom(l)
			switch {
			case err != nil:
				t.Errorf("%s: %s: %v", set.name, c.Name, err)
			case c.Name == "kipper-crds" && !ready:
				t.Errorf("%s: kipper-crds, applied, is pending: %s", set.name, pending)
			case c.Name == "traefik" && (ready || !strings.Contains(pending, "0.0.1")):
				t.Errorf("%s: traefik, whose Job installed another version: ready %v, %q", set.name, ready, pending)
			}
		}
	}

	// A component ReadListed was not asked about is an error, not a silent "ready".
	l := ReadListed(ctx, cl, []Component{componentNamed(t, small, "kipper-crds")})
	if _, _, err := componentNamed(t, small, "traefik").StatusFrom(l); err == nil || !strings.Contains(err.Error(), "not read") {
		t.Errorf("traefik judged from kipper-crds' lists: %v", err)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
