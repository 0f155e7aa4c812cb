package manifests

import (
	"regexp"
	"testing"
)

func TestPinnedVersionsParse(t *testing.T) {
	v, err := Pinned()
	if err != nil {
		t.Fatal(err)
	}
	semver := regexp.MustCompile(`^v\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$`)
	if !semver.MatchString(v.Kubernetes) {
		t.Errorf("kubernetes %q is not a version", v.Kubernetes)
	}
	seen := map[string]bool{}
	for _, c := range v.Components {
		if seen[c.Name] {
			t.Errorf("component %s pinned twice", c.Name)
		}
		seen[c.Name] = true
		if !semver.MatchString(c.Version) {
			t.Errorf("component %s version %q is not a version", c.Name, c.Version)
		}
		if c.SHA256 != "" && !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(c.SHA256) {
			t.Errorf("component %s sha256 %q is not a SHA-256", c.Name, c.SHA256)
		}
	}
	for _, name := range []string{"k3s", "longhorn", "velero"} {
		if _, err := v.Component(name); err != nil {
			t.Error(err)
		}
	}
	if _, err := v.Component("nope"); err == nil {
		t.Error("Component(nope) found something")
	}
}
