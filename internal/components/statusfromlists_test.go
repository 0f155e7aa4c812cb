package components

import (
	"context"
	"fmt"
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

// verdict is what Status or StatusFrom said of one component.
type verdict struct {
	ready   bool
	pending string
	err     string
}

func (v verdict) String() string {
	return fmt.Sprintf("ready %v, pending %q, err %q", v.ready, v.pending, v.err)
}

func judge(ready bool, pending string, err error) verdict {
	v := verdict{ready: ready, pending: pending}
	if err != nil {
		v.err = err.Error()
	}
	return v
}

// TestStatusFromListsAgreesWithStatus judges every component of a small and of the largest set
// both ways, with CRDs, Jobs, workloads and After objects in various states: StatusFrom says
// what Status says, from a fixed number of list requests.
func TestStatusFromListsAgreesWithStatus(t *testing.T) {
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
		// Controllers and kwok move objects between the two readings: compare until a reading
		// agrees throughout.
		var diffs []string
		for {
			requests.Store(0)
			l := ReadListed(ctx, counted, set.comps)
			n := requests.Load()
			diffs = nil
			for _, c := range set.comps {
				want := judge(c.Status(ctx, cl))
				got := judge(c.StatusFrom(l))
				if got != want {
					diffs = append(diffs, fmt.Sprintf("%s: Status %s; StatusFrom %s", c.Name, want, got))
				}
			}
			// Jobs of one namespace, kip's CRDs, three kinds of workload, discovery (twice when
			// a kind is not served yet) and one list per kind and namespace of After objects.
			if n > 12 {
				t.Errorf("%s: ReadListed made %d requests", set.name, n)
			}
			if len(diffs) == 0 {
				t.Logf("%s: StatusFrom agrees with Status on %d components, from %d requests", set.name, len(set.comps), n)
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: StatusFrom disagrees with Status:\n%s", set.name, strings.Join(diffs, "\n"))
			case <-time.After(500 * time.Millisecond):
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
