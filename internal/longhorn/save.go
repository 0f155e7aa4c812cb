package longhorn

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/kube"
)

// savedKinds are the Longhorn objects a step saves before it changes the release (spec 002,
// step 3): what describes each volume's data and the settings.
var savedKinds = []string{"volumes", "replicas", "engines", "settings"}

// SaveObjects writes Longhorn's volumes, replicas, engines and settings as YAML, one file per
// kind (volumes.yaml…), in dir (made 0700; the files 0600: readable only by the operator), as
// the API serves them unstructured, so that no field of the running release is dropped (kip's
// typed client is one release's). It returns the files it wrote.
func SaveObjects(ctx context.Context, cl *kube.Clients, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	var files []string
	for _, kind := range savedKinds {
		gvr := schema.GroupVersionResource{Group: "longhorn.io", Version: "v1beta2", Resource: kind}
		list, err := cl.Dynamic.Resource(gvr).Namespace(Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return files, fmt.Errorf("list Longhorn's %s: %w", kind, err)
		}
		data, err := yaml.Marshal(list.UnstructuredContent())
		if err != nil {
			return files, fmt.Errorf("write Longhorn's %s as YAML: %w", kind, err)
		}
		path := filepath.Join(dir, kind+".yaml")
		if err := config.WriteFileAtomic(path, data, 0o600); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}
