package manifests

import (
	"net/url"
	"regexp"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

var (
	semver = regexp.MustCompile(`^v\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$`)
	// chartVersion is a chart's version as its repository publishes it, with or without "v".
	chartVersion = regexp.MustCompile(`^v?\d+\.\d+\.\d+$`)
	// minioRelease is how MinIO names its releases.
	minioRelease = regexp.MustCompile(`^RELEASE\.\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}Z$`)
)

func TestPinnedVersionsParse(t *testing.T) {
	v, err := Pinned()
	if err != nil {
		t.Fatal(err)
	}
	if !semver.MatchString(v.Kubernetes) {
		t.Errorf("kubernetes %q is not a version", v.Kubernetes)
	}
	seen := map[string]bool{}
	for _, c := range v.Components {
		if seen[c.Name] {
			t.Errorf("component %s pinned twice", c.Name)
		}
		seen[c.Name] = true
		switch {
		case semver.MatchString(c.Version):
		case c.Version == "latest" && c.Image != "" && c.Chart == "":
			// the console images roll forward by design (kip upgrade restarts them)
		case c.Name == "minio" && minioRelease.MatchString(c.Version):
		default:
			t.Errorf("component %s version %q is not a version", c.Name, c.Version)
		}
		if c.SHA256 != "" && !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(c.SHA256) {
			t.Errorf("component %s sha256 %q is not a SHA-256", c.Name, c.SHA256)
		}
		if c.Chart != "" || c.ChartVersion != "" || c.Repo != "" {
			if c.Chart == "" || !chartVersion.MatchString(c.ChartVersion) {
				t.Errorf("component %s: chart %q version %q: a chart needs a name and a version", c.Name, c.Chart, c.ChartVersion)
			}
			if u, err := url.Parse(c.Repo); err != nil || u.Scheme != "https" || u.Host == "" {
				t.Errorf("component %s: chart repository %q is not an https URL", c.Name, c.Repo)
			}
		}
	}
	for _, name := range []string{"k3s", "longhorn", "velero", "velero-plugin-for-aws", "traefik", "cert-manager",
		"dex", "zot", "keda", "minio", "prometheus", "loki", "console", "console-api"} {
		if _, err := v.Component(name); err != nil {
			t.Error(err)
		}
	}
	if _, err := v.Component("nope"); err == nil {
		t.Error("Component(nope) found something")
	}
}

// TestLonghornChartIsTheRelease keeps the Longhorn chart on the release kip records: kip upgrade
// --longhorn reasons about the release, and helm-controller installs the chart.
func TestLonghornChartIsTheRelease(t *testing.T) {
	v, err := Pinned()
	if err != nil {
		t.Fatal(err)
	}
	lh, err := v.Component("longhorn")
	if err != nil {
		t.Fatal(err)
	}
	if "v"+lh.ChartVersion != lh.Version {
		t.Errorf("longhorn chart %s does not install release %s", lh.ChartVersion, lh.Version)
	}
}

func TestCRDs(t *testing.T) {
	docs, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, doc := range docs {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(doc, &crd); err != nil {
			t.Fatalf("CRD does not parse: %v\n%s", err, doc)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Spec.Group != "kipper.run" {
			t.Errorf("%s: %s in group %q, want a CustomResourceDefinition of kipper.run", crd.Name, crd.Kind, crd.Spec.Group)
		}
		if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
			t.Errorf("CRD %s should be named %s", crd.Name, want)
		}
		var stored int
		for _, ver := range crd.Spec.Versions {
			if ver.Storage {
				stored++
				if ver.Name != "v1alpha1" || !ver.Served {
					t.Errorf("%s stores %s (served %v), want a served v1alpha1", crd.Name, ver.Name, ver.Served)
				}
			}
			if ver.Schema == nil || ver.Schema.OpenAPIV3Schema == nil {
				t.Errorf("%s %s has no schema", crd.Name, ver.Name)
			}
		}
		if stored != 1 {
			t.Errorf("%s has %d storage versions", crd.Name, stored)
		}
		kinds[crd.Spec.Names.Kind] = true
	}
	for _, k := range []string{"App", "Project", "Service", "Function", "ClusterIdentity"} {
		if !kinds[k] {
			t.Errorf("no CRD for %s", k)
		}
	}
}
