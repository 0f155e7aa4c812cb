// Package credential is kip's side of the contract with console-api about shared git
// credentials: Secrets console-api keeps in kipper-system that any project's apps may name to
// clone their git repository, and each one's allow-list of projects. docs/console.md
// (Shared git credentials) documents the contract.
//
// A shared git credential NAME is the Secret NAME in namespace kipper-system labelled
// kipper.run/git-credential=true. kip reads and writes only its metadata, through the metadata
// client: kip never receives, keeps or prints a credential's data. Its allow-list is the
// annotation kipper.run/allowed-projects, project names comma-separated, sorted, no spaces:
//   - absent: never set (a cluster from before allow-lists), and console-api lets every
//     project's apps use the credential;
//   - present, even empty: console-api lets only the listed projects' apps use it.
//
// An app names the credential it clones with as spec.git.credential; its project is the
// kipper.run/project label of its namespace.
//
// kip writes the allow-list in two places: kip upgrade seeds the lists never set, once and on
// consent, with the projects whose apps already use each credential (Seeds, SeedStep), and
// kip credentials allow adds projects to one list (Allow).
package credential

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/kube"
)

const (
	// Namespace holds the shared git credentials.
	Namespace = "kipper-system"
	// Label marks a Secret of Namespace as a shared git credential, with the value "true".
	Label = "kipper.run/git-credential"
	// Selector selects the shared git credentials among Namespace's Secrets.
	Selector = Label + "=true"
	// AllowedAnnotation is a credential's allow-list: project names, comma-separated, sorted,
	// no spaces. Absent: never set, every project may use the credential.
	AllowedAnnotation = "kipper.run/allowed-projects"
)

// SecretsGVR is the resource the metadata client reads the credentials as.
var SecretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// Credential is a shared git credential as kip reads it: its metadata, never its data.
type Credential struct {
	Name string
	// Allowed are the projects of its allow-list, sorted; empty when never set (see Set).
	Allowed []string
	// Set reports whether the allow-list is set (the annotation is present, even empty).
	Set bool
	// ResourceVersion is the Secret's, which a write tests.
	ResourceVersion string
}

// Allows reports whether console-api lets project's apps use the credential.
func (c Credential) Allows(project string) bool {
	return !c.Set || slices.Contains(c.Allowed, project)
}

// List reads the cluster's shared git credentials, sorted by name, in one API request: the
// Secrets of Namespace with the Label, as their metadata alone.
func List(ctx context.Context, cl *kube.Clients) ([]Credential, error) {
	if cl.Metadata == nil {
		return nil, errors.New("list the shared git credentials: no metadata client")
	}
	list, err := cl.Metadata.Resource(SecretsGVR).Namespace(Namespace).List(ctx, metav1.ListOptions{LabelSelector: Selector})
	if err != nil {
		return nil, fmt.Errorf("list the shared git credentials (Secrets in %s labelled %s): %w", Namespace, Selector, err)
	}
	out := make([]Credential, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, fromMeta(&list.Items[i]))
	}
	slices.SortFunc(out, func(a, b Credential) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func fromMeta(m *metav1.PartialObjectMetadata) Credential {
	value, set := m.Annotations[AllowedAnnotation]
	return Credential{Name: m.Name, Allowed: ParseAllowed(value), Set: set, ResourceVersion: m.ResourceVersion}
}

// get reads credential name's metadata; nil when it does not exist (or is no longer labelled a
// shared git credential).
func get(ctx context.Context, md metadata.Interface, name string) (*Credential, error) {
	m, err := md.Resource(SecretsGVR).Namespace(Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read shared git credential %s: %w", name, err)
	}
	if m.Labels[Label] != "true" {
		return nil, nil
	}
	c := fromMeta(m)
	return &c, nil
}

// ParseAllowed reads an allow-list annotation's value: the project names, sorted and unique.
// It reads leniently (spaces around a name, empty entries) what FormatAllowed writes strictly.
func ParseAllowed(value string) []string {
	var out []string
	for _, p := range strings.Split(value, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// FormatAllowed is the allow-list annotation's value for projects: sorted, unique,
// comma-separated, no spaces.
func FormatAllowed(projects []string) string {
	return strings.Join(sortedUnique(projects), ",")
}

// sortedUnique is projects sorted, without duplicates or empty names; never nil.
func sortedUnique(projects []string) []string {
	out := []string{}
	for _, p := range projects {
		if p != "" {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// errConflict is the API server's refusal of a write whose resourceVersion is no longer the
// Secret's.
var errConflict = errors.New("the credential changed since kip read it")

// writeAllowed sets c's allow-list to projects, in one merge patch whose resourceVersion is the
// one c was read at: the API server refuses it (errConflict) when the Secret changed since.
// Only the annotation and the resourceVersion are in the patch: nothing of the Secret's data.
func writeAllowed(ctx context.Context, md metadata.Interface, c Credential, projects []string) error {
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": c.ResourceVersion,
		"annotations":     map[string]any{AllowedAnnotation: FormatAllowed(projects)},
	}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("write the allow-list of shared git credential %s: %w", c.Name, err)
	}
	_, err = md.Resource(SecretsGVR).Namespace(Namespace).Patch(ctx, c.Name, types.MergePatchType, raw, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if apierrors.IsConflict(err) {
		return errConflict
	}
	if err != nil {
		return fmt.Errorf("write the allow-list of shared git credential %s: %w", c.Name, err)
	}
	return nil
}

// References reads which projects' apps name each shared git credential: credential name →
// the projects, sorted, in two API requests (the project namespaces and the Apps). An App in a
// namespace no project has is left out, as the upgrade's check leaves it out.
func References(ctx context.Context, cl *kube.Clients) (map[string][]string, error) {
	apps, _, err := app.ListInProjects(ctx, cl)
	if err != nil {
		return nil, err
	}
	refs := map[string][]string{}
	for _, a := range apps {
		if name := AppCredential(a.Object); name != "" {
			refs[name] = append(refs[name], a.Project)
		}
	}
	for name, projects := range refs {
		refs[name] = sortedUnique(projects)
	}
	return refs, nil
}

// AppCredential is the shared git credential an App names (spec.git.credential), "" for none.
func AppCredential(app *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(app.Object, "spec", "git", "credential")
	return name
}
