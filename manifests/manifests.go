// Package manifests embeds what kip applies to clusters and the versions it pins.
package manifests

import (
	_ "embed"
	"fmt"

	"sigs.k8s.io/yaml"
)

//go:embed versions.yaml
var versionsYAML []byte

// Component is one pinned component.
type Component struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	SHA256  string `json:"sha256,omitempty"`
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
