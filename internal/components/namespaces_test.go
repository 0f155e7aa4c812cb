package components

import (
	"slices"
	"testing"
)

// TestCatalogue checks that the catalogue holds every component and every pinned chart, and the
// system namespaces and charts it gives kip platform versions.
func TestCatalogue(t *testing.T) {
	pinned := testPinned(t)
	cat, err := Catalogue(pinned)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kipper-crds", "kipper-base", "traefik", "cert-manager", "longhorn", "dex", "zot", "keda", "minio", "velero", "prometheus", "loki", "console"}
	if got := componentNames(cat); !slices.Equal(got, want) {
		t.Errorf("catalogue %v, want %v", got, want)
	}
	wantNS := []string{"kipper-system", "traefik", "cert-manager", "longhorn-system", "dex", "zot", "keda", "velero", "monitoring", "loki", "kube-system"}
	if got := SystemNamespaces(cat); !slices.Equal(got, wantNS) {
		t.Errorf("system namespaces %v, want %v", got, wantNS)
	}

	charts, err := Charts(cat)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Chart{}
	for _, ch := range charts {
		byName[ch.Component] = ch
	}
	for _, p := range pinned.Components {
		if p.Chart == "" {
			continue
		}
		ch, ok := byName[p.Name]
		if !ok {
			t.Errorf("versions.yaml pins chart %s for %s, which the catalogue does not install", p.Chart, p.Name)
			continue
		}
		if ch.Release != p.Name || ch.Chart != p.Chart || ch.Version != p.ChartVersion || ch.Repo != p.Repo {
			t.Errorf("%s: chart %+v, want release %s chart %s %s from %s", p.Name, ch, p.Name, p.Chart, p.ChartVersion, p.Repo)
		}
	}
	if len(charts) != len(byName) {
		t.Errorf("charts %+v: a component twice", charts)
	}
	if got := byName["prometheus"]; got.Namespace != "monitoring" || got.Chart != "kube-prometheus-stack" {
		t.Errorf("prometheus chart %+v, want kube-prometheus-stack in monitoring", got)
	}
	if got := byName["minio"]; got.Namespace != "velero" {
		t.Errorf("minio chart %+v, want its release in velero", got)
	}
}
