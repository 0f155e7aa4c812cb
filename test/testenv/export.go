package testenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// LonghornCRDs returns Longhorn's CRD manifests from the longhorn-manager module this checkout
// builds against (k8s/crds.yaml, its Helm template actions removed), for tests that stand in for
// what the Longhorn chart installs.
func LonghornCRDs() ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	const longhorn = "github.com/longhorn/longhorn-manager"
	dirs, err := moduleDirs(root, longhorn)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dirs[longhorn], "k8s", "crds.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read Longhorn's CRDs: %w", err)
	}
	return helmAction.ReplaceAll(data, nil), nil
}
