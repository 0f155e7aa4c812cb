// Package manifests embeds what kip applies to clusters and the versions it pins.
package manifests

import (
	"embed"
	"fmt"
	"io/fs"
	"path"

	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/fault"
)

//go:embed versions.yaml
var versionsYAML []byte

//go:embed mover-image.yaml
var moverImageYAML []byte

// MoverImagePin is manifests/mover-image.yaml: the data mover's image and its digest, and the Go
// release that builds it to that digest.
type MoverImagePin struct {
	Image  string `json:"image"`
	Digest string `json:"digest"`
	Go     string `json:"go"`
}

// Reference is the image by digest, as a pod names it.
func (p MoverImagePin) Reference() string { return p.Image + "@" + p.Digest }

// MoverImage parses the embedded mover-image.yaml.
func MoverImage() (MoverImagePin, error) {
	var p MoverImagePin
	if err := yaml.UnmarshalStrict(moverImageYAML, &p); err != nil {
		return p, fmt.Errorf("parse embedded mover-image.yaml: %w", err)
	}
	return p, nil
}

//go:embed crds/*.yaml
var crdFiles embed.FS

// Component is one pinned component.
type Component struct {
	Name string `json:"name"`
	// Version is the component's own release: what kip records and prints.
	Version string `json:"version"`
	SHA256  string `json:"sha256,omitempty"`
	// Image is the container image repository the component runs, tagged Version.
	Image string `json:"image,omitempty"`
	// Chart, ChartVersion and Repo are the Helm chart k3s's helm-controller installs.
	Chart        string `json:"chart,omitempty"`
	ChartVersion string `json:"chartVersion,omitempty"`
	Repo         string `json:"repo,omitempty"`
}

// Versions is manifests/versions.yaml.
type Versions struct {
	Kubernetes string      `json:"kubernetes"`
	Components []Component `json:"components"`
}

// Pinned parses the embedded versions.yaml.
func Pinned() (*Versions, error) {
	var v Versions
	if err := yaml.UnmarshalStrict(versionsYAML, &v); err != nil {
		return nil, fmt.Errorf("parse embedded versions.yaml: %w", err)
	}
	for i, c := range v.Components {
		if version, ok := fault.Pinned(c.Name); ok {
			v.Components[i].Version, v.Components[i].SHA256 = version, ""
		}
	}
	return &v, nil
}

// Component returns the pinned component named name.
func (v *Versions) Component(name string) (Component, error) {
	for _, c := range v.Components {
		if c.Name == name {
			return c, nil
		}
	}
	return Component{}, fmt.Errorf("versions.yaml pins no component %q", name)
}

// CRDs returns the Kipper CustomResourceDefinitions, manifests/crds/*.yaml, one file each, in
// file name order (fs.Glob's).
func CRDs() ([][]byte, error) {
	names, err := fs.Glob(crdFiles, "crds/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded CRDs: %w", err)
	}
	out := make([][]byte, 0, len(names))
	for _, name := range names {
		data, err := crdFiles.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read embedded CRD %s: %w", path.Base(name), err)
		}
		out = append(out, data)
	}
	return out, nil
}
