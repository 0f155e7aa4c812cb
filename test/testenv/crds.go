package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/kube"
)

const modulePath = "kipper.run/kip"

// RepoRoot returns the root of the kip checkout: the nearest directory above the working
// directory whose go.mod declares module kipper.run/kip.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && goModModule(data) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find repository root: no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

func goModModule(data []byte) string {
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// moduleDirs returns the source directories of modules in the repository's build list,
// downloaded into the module cache.
func moduleDirs(root string, paths ...string) (map[string]string, error) {
	args := append([]string{"list", "-m", "-f", "{{.Path}} {{.Dir}}"}, paths...)
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dirs := map[string]string{}
	out, err := cmd.Output()
	if err != nil {
		// go.mod may be mid-edit by someone else: fall back to its require lines and the module
		// cache's layout.
		if dirs, err = moduleDirsFromGoMod(root, paths); err != nil {
			return nil, fmt.Errorf("go list -m %s: %s; %w", strings.Join(paths, " "), strings.TrimSpace(stderr.String()), err)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, dir, ok := strings.Cut(line, " "); ok {
			dirs[path] = dir
		}
	}
	for _, p := range paths {
		if dirs[p] == "" {
			return nil, fmt.Errorf("module %s is not in the module cache (run go mod download %s)", p, p)
		}
	}
	return dirs, nil
}

func moduleDirsFromGoMod(root string, paths []string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		return nil, err
	}
	dirs := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) < 2 || !slices.Contains(paths, f[0]) {
			continue
		}
		dir := filepath.Join(cache, f[0]+"@"+f[1])
		if _, err := os.Stat(dir); err == nil {
			dirs[f[0]] = dir
		}
	}
	return dirs, nil
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if goroot := os.Getenv("GOROOT"); goroot != "" {
		return filepath.Join(goroot, "bin", "go")
	}
	return "go"
}

// goEnv returns one value of go env.
func goEnv(name string) (string, error) {
	out, err := exec.Command(goTool(), "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// crdSource is a set of CRD manifest files.
type crdSource struct {
	name  string
	files []string
	// helm marks files that are Helm templates (Longhorn's crds.yaml carries one
	// `{{- include "longhorn.labels" . }}` per CRD), rendered by renderLonghornTemplate.
	helm bool
}

// crdSources lists the CRDs the environment installs: Longhorn's, Velero's, k3s's helm-controller's
// (HelmChart, HelmChartConfig) and Kipper's (manifests/crds, when it exists).
func crdSources(root string) ([]crdSource, error) {
	const (
		longhorn = "github.com/longhorn/longhorn-manager"
		velero   = "github.com/vmware-tanzu/velero"
		helm     = "github.com/k3s-io/helm-controller"
	)
	dirs, err := moduleDirs(root, longhorn, velero, helm)
	if err != nil {
		return nil, err
	}
	// v1 (Backup, Restore, BackupStorageLocation, ...) and v2alpha1 (DataUpload, DataDownload):
	// the Velero server refuses to start without every one of them, as its chart installs them.
	var veleroFiles []string
	for _, version := range []string{"v1", "v2alpha1"} {
		files, err := filepath.Glob(filepath.Join(dirs[velero], "config", "crd", version, "bases", "*.yaml"))
		if err != nil || len(files) == 0 {
			return nil, fmt.Errorf("no velero CRDs in %s/config/crd/%s/bases", dirs[velero], version)
		}
		veleroFiles = append(veleroFiles, files...)
	}
	helmFiles, err := filepath.Glob(filepath.Join(dirs[helm], "pkg", "crds", "yaml", "generated", "*.yaml"))
	if err != nil || len(helmFiles) == 0 {
		return nil, fmt.Errorf("no helm-controller CRDs in %s/pkg/crds/yaml/generated", dirs[helm])
	}
	sources := []crdSource{
		{name: "longhorn", files: []string{filepath.Join(dirs[longhorn], "k8s", "crds.yaml")}, helm: true},
		{name: "velero", files: veleroFiles},
		{name: "helm-controller", files: helmFiles},
	}
	kipper, _ := filepath.Glob(filepath.Join(root, "manifests", "crds", "*.yaml"))
	if len(kipper) > 0 {
		sources = append(sources, crdSource{name: "kipper", files: kipper})
	}
	return sources, nil
}

var helmAction = regexp.MustCompile(`\{\{-?[^}]*-?\}\}`)

// longhornLabelsAction is the template action that gives each of Longhorn's CRDs its labels.
var longhornLabelsAction = regexp.MustCompile(`\{\{- include "longhorn\.labels" \. \| nindent 4 \}\}`)

// renderLonghornTemplate renders longhorn-manager's crds.yaml (a template of Longhorn's chart)
// as the chart renders it for release (the module's version, v1.10.0): each CRD labelled
// app.kubernetes.io/name=longhorn, by which Longhorn's documentation finds its CRDs, with its
// instance and version (the labels Longhorn's deploy/longhorn.yaml shows); any other action is
// removed.
func renderLonghornTemplate(data []byte, release string) []byte {
	labels := "\n    app.kubernetes.io/name: longhorn\n    app.kubernetes.io/instance: longhorn\n    app.kubernetes.io/version: " + release
	return helmAction.ReplaceAll(longhornLabelsAction.ReplaceAll(data, []byte(labels)), nil)
}

// moduleVersion is the version of the module a module cache directory holds (…/name@v1.10.0).
func moduleVersion(dir string) string {
	_, v, _ := strings.Cut(filepath.Base(dir), "@")
	return v
}

// loadCRDs reads every CRD of the sources.
func loadCRDs(sources []crdSource) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, src := range sources {
		for _, file := range src.files {
			data, err := os.ReadFile(file)
			if err != nil {
				return nil, fmt.Errorf("read %s CRDs: %w", src.name, err)
			}
			if src.helm {
				data = renderLonghornTemplate(data, moduleVersion(filepath.Dir(filepath.Dir(file))))
			}
			got, err := decodeCRDs(data)
			if err != nil {
				return nil, fmt.Errorf("decode %s: %w", file, err)
			}
			crds = append(crds, got...)
		}
	}
	return crds, nil
}

func decodeCRDs(data []byte) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	objs, err := kube.DecodeManifests(data)
	if err != nil {
		return nil, err
	}
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(objs))
	for i, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			return nil, fmt.Errorf("document %d: %s %s is not a CustomResourceDefinition", i+1, o.GetAPIVersion(), o.GetKind())
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, crd, true); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// installCRDs creates the CRDs (a few at a time) and waits until all are Established.
func installCRDs(ctx context.Context, client apiextensionsclientset.Interface, crds []*apiextensionsv1.CustomResourceDefinition) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 6)
	)
	for _, crd := range crds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{FieldManager: "kip-testenv"})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("create CRD %s: %w", crd.Name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, crd := range crds {
		want[crd.Name] = true
	}
	var pending []string
	for {
		list, err := client.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{})
		if err == nil {
			pending = pending[:0]
			established := map[string]bool{}
			for _, crd := range list.Items {
				for _, c := range crd.Status.Conditions {
					if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
						established[crd.Name] = true
					}
				}
			}
			for name := range want {
				if !established[name] {
					pending = append(pending, name)
				}
			}
			if len(pending) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			sort.Strings(pending)
			return fmt.Errorf("wait for CRDs established: %w (pending: %s)", ctx.Err(), strings.Join(pending, ", "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
