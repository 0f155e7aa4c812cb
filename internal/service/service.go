// Package service is kip's side of the contract with console-api about a Kipper service
// (services.kipper.run): kip writes a few fields of the Service object and console-api turns
// them into the service's workload; kip never edits that workload itself. docs/console.md
// documents the contract, which the lab's console stand-in (test/console-standin) follows.
//
// What kip writes, and what console-api does with it:
//   - spec.stopped: true scales the service's StatefulSet to 0; status.phase becomes Stopped once
//     no pod of the service is left. false scales it to 1; status.phase becomes Running when its
//     pod is Ready.
//   - spec.resources (cpuRequest, cpuLimit, memoryRequest, memoryLimit) and spec.storage (the
//     declared size of the data volume): console-api rolls the pod with the new values and grows
//     the data claim.
//   - spec.storageClass: the class of the data volume's claim template; console-api recreates
//     the StatefulSet (a claim template cannot change) and keeps the claims that exist.
//   - the annotation kipper.run/storage-move while a move of the service's data is unfinished:
//     console-api keeps the service stopped whatever spec.stopped says, and the console refuses
//     to delete its project or remove its environment.
//
// The workload console-api keeps, which kip reads: a StatefulSet named as the service, its pod
// labelled kipper.run/service=<name>, with the claim data-<name>-0 (and, for a service with
// consistent backups, the dump volume dump-<name>-0). status.observedGeneration is the generation
// console-api last acted on.
package service

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/util/podutils"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
)

// The Kipper resources kip reads and writes.
var (
	ServicesGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "services"}
	ProjectsGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "projects"}
)

const (
	// Label is on every pod of a service, with the service's name.
	Label = "kipper.run/service"
	// MoveAnnotation is on a Service while a move of its data is unfinished; its value says
	// where to ("longhorn").
	MoveAnnotation = "kipper.run/storage-move"

	// Phases console-api reports in status.phase.
	PhaseRunning  = "Running"
	PhaseStopped  = "Stopped"
	PhaseStarting = "Starting"
	PhaseStopping = "Stopping"
)

// Types whose services have a dump volume: the database dump that makes their backups consistent.
var dumpTypes = []string{"postgres", "mysql"}

// Ref names a service: its project, environment and name.
type Ref struct {
	Project     string `json:"project"`
	Environment string `json:"environment"`
	Name        string `json:"name"`
}

// Namespace is the environment's namespace.
func (r Ref) Namespace() string { return r.Project + "-" + r.Environment }

func (r Ref) String() string { return r.Name + " in " + r.Namespace() }

// Flags is how a command names this service, as the operator types it.
func (r Ref) Flags() string {
	return fmt.Sprintf("%s --project %s --environment %s", r.Name, r.Project, r.Environment)
}

// Resources are the service's requests and limits as the Service declares them ("" = unset).
type Resources struct {
	CPURequest    string `json:"cpuRequest,omitempty"`
	CPULimit      string `json:"cpuLimit,omitempty"`
	MemoryRequest string `json:"memoryRequest,omitempty"`
	MemoryLimit   string `json:"memoryLimit,omitempty"`
}

// Service is a Kipper service as kip reads it.
type Service struct {
	Ref
	Type         string
	Version      string
	Storage      string // the declared size, e.g. 20Gi
	StorageClass string // "" = the cluster's default class
	// Copies is how many copies of its data the service keeps (spec.copies), 0 when unset: a
	// service created before copies were recorded.
	Copies    int
	Stopped   bool
	Resources Resources
	// Phase and ObservedGeneration are console-api's report; Generation the object's.
	Phase              string
	ObservedGeneration int64
	Generation         int64
	// Move is the MoveAnnotation's value, "" when no move is unfinished.
	Move string
	// FenceStop is the FenceAnnotation's value: the fenced worker that stopped it, or "".
	FenceStop string
	UID       types.UID
}

// StatefulSet is the name of the service's StatefulSet.
func (s *Service) StatefulSet() string { return s.Name }

// DataClaim is the claim of the service's data volume.
func (s *Service) DataClaim() string { return "data-" + s.Name + "-0" }

// DumpClaim is the claim of its dump volume, "" for a type without one.
func (s *Service) DumpClaim() string {
	if !slices.Contains(dumpTypes, s.Type) {
		return ""
	}
	return "dump-" + s.Name + "-0"
}

// Get reads the service ref names, refusing a project, environment or service that does not
// exist with the names that do.
func Get(ctx context.Context, dyn dynamic.Interface, ref Ref) (*Service, error) {
	if err := CheckEnvironment(ctx, dyn, ref.Project, ref.Environment); err != nil {
		return nil, err
	}
	u, err := dyn.Resource(ServicesGVR).Namespace(ref.Namespace()).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		names, lerr := kube.Names(ctx, dyn, ServicesGVR, ref.Namespace())
		if lerr != nil {
			return nil, lerr
		}
		return nil, fmt.Errorf("no service %s in %s (project %s, environment %s; services there: %s)",
			ref.Name, ref.Namespace(), ref.Project, ref.Environment, cli.OrNone(strings.Join(names, ", ")))
	}
	if err != nil {
		return nil, fmt.Errorf("read service %s: %w", ref, err)
	}
	return FromObject(ref, u)
}

// FromObject reads a Service object.
func FromObject(ref Ref, u *unstructured.Unstructured) (*Service, error) {
	var obj struct {
		Spec struct {
			Type         string    `json:"type"`
			Version      string    `json:"version"`
			Storage      string    `json:"storage"`
			StorageClass string    `json:"storageClass"`
			Copies       int       `json:"copies"`
			Stopped      bool      `json:"stopped"`
			Resources    Resources `json:"resources"`
		} `json:"spec"`
		Status struct {
			Phase              string `json:"phase"`
			ObservedGeneration int64  `json:"observedGeneration"`
		} `json:"status"`
	}
	raw, err := json.Marshal(u.Object)
	if err == nil {
		err = json.Unmarshal(raw, &obj)
	}
	if err != nil {
		return nil, fmt.Errorf("read service %s: %w", ref, err)
	}
	return &Service{Ref: ref, Type: obj.Spec.Type, Version: obj.Spec.Version, Storage: obj.Spec.Storage,
		StorageClass: obj.Spec.StorageClass, Copies: obj.Spec.Copies, Stopped: obj.Spec.Stopped, Resources: obj.Spec.Resources,
		Phase: obj.Status.Phase, ObservedGeneration: obj.Status.ObservedGeneration, Generation: u.GetGeneration(),
		Move: u.GetAnnotations()[MoveAnnotation], FenceStop: u.GetAnnotations()[FenceAnnotation], UID: u.GetUID()}, nil
}

// ProjectLabel is on every environment namespace, with its project's name.
const ProjectLabel = "kipper.run/project"

// List reads every Kipper service of the cluster, named through its namespace's ProjectLabel;
// a Service in a namespace of no project is left out.
func List(ctx context.Context, dyn dynamic.Interface, cs kubernetes.Interface) ([]*Service, error) {
	list, err := dyn.Resource(ServicesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Kipper services: %w", err)
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: ProjectLabel})
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	project := map[string]string{}
	for _, ns := range nss.Items {
		project[ns.Name] = ns.Labels[ProjectLabel]
	}
	var out []*Service
	for i := range list.Items {
		u := &list.Items[i]
		p := project[u.GetNamespace()]
		if p == "" {
			continue
		}
		s, err := FromObject(RefIn(p, u.GetNamespace(), u.GetName()), u)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// RefIn names service name in namespace ns of project.
func RefIn(project, ns, name string) Ref {
	return Ref{Project: project, Environment: strings.TrimPrefix(ns, project+"-"), Name: name}
}

// Project reads a Kipper project, refusing one that does not exist with the names that do.
func Project(ctx context.Context, dyn dynamic.Interface, project string) (*unstructured.Unstructured, error) {
	p, err := dyn.Resource(ProjectsGVR).Get(ctx, project, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		list, lerr := dyn.Resource(ProjectsGVR).List(ctx, metav1.ListOptions{})
		if lerr != nil {
			return nil, fmt.Errorf("list Kipper projects: %w", lerr)
		}
		var names []string
		for _, p := range list.Items {
			names = append(names, p.GetName())
		}
		slices.Sort(names)
		return nil, fmt.Errorf("no Kipper project %q on this cluster (projects: %s)", project, cli.OrNone(strings.Join(names, ", ")))
	}
	if err != nil {
		return nil, fmt.Errorf("read project %s: %w", project, err)
	}
	return p, nil
}

// Environments are a project's environments, in its order.
func Environments(p *unstructured.Unstructured) []string {
	envs, _, _ := unstructured.NestedSlice(p.Object, "spec", "environments")
	var names []string
	for _, e := range envs {
		if m, ok := e.(map[string]any); ok {
			if n, ok := m["name"].(string); ok {
				names = append(names, n)
			}
		}
	}
	return names
}

// Find completes ref when it names the service alone (no project or environment, or only the
// project): the one service of that name among the projects' environments. It refuses a name no
// environment has, and one several have, naming how to pick each.
func Find(ctx context.Context, dyn dynamic.Interface, ref Ref) (Ref, error) {
	if ref.Project != "" && ref.Environment != "" {
		return ref, nil
	}
	projects, err := dyn.Resource(ProjectsGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ref, fmt.Errorf("list projects: %w", err)
	}
	var found []Ref
	for i := range projects.Items {
		p := &projects.Items[i]
		if ref.Project != "" && p.GetName() != ref.Project {
			continue
		}
		for _, env := range Environments(p) {
			if ref.Environment != "" && env != ref.Environment {
				continue
			}
			cand := Ref{Project: p.GetName(), Environment: env, Name: ref.Name}
			_, err := dyn.Resource(ServicesGVR).Namespace(cand.Namespace()).Get(ctx, ref.Name, metav1.GetOptions{})
			switch {
			case err == nil:
				found = append(found, cand)
			case !apierrors.IsNotFound(err):
				return ref, fmt.Errorf("read service %s: %w", cand, err)
			}
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		var names []string
		for _, p := range projects.Items {
			names = append(names, p.GetName())
		}
		where := "any environment of the projects " + cli.OrNone(strings.Join(names, ", "))
		if ref.Project != "" {
			where = "an environment of project " + ref.Project
		}
		return ref, fmt.Errorf("no service %s in %s", ref.Name, where)
	}
	var picks []string
	for _, r := range found {
		picks = append(picks, r.Flags())
	}
	return ref, fmt.Errorf("services named %s are in %d environments: name one with --project and --environment (%s)", ref.Name, len(found), strings.Join(picks, "; "))
}

// CheckEnvironment refuses a project or an environment that does not exist, naming those that do.
func CheckEnvironment(ctx context.Context, dyn dynamic.Interface, project, env string) error {
	p, err := Project(ctx, dyn, project)
	if err != nil {
		return err
	}
	if envs := Environments(p); !slices.Contains(envs, env) {
		return fmt.Errorf("project %s has no environment %q (environments: %s)", project, env, cli.OrNone(strings.Join(envs, ", ")))
	}
	return nil
}

// patchSpec merge-patches the Service's spec and annotations (nil values remove a key).
func patchSpec(ctx context.Context, dyn dynamic.Interface, ref Ref, spec map[string]any, annotations map[string]any) error {
	patch := map[string]any{}
	if spec != nil {
		patch["spec"] = spec
	}
	if annotations != nil {
		patch["metadata"] = map[string]any{"annotations": annotations}
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = dyn.Resource(ServicesGVR).Namespace(ref.Namespace()).Patch(ctx, ref.Name, types.MergePatchType, raw, metav1.PatchOptions{FieldManager: kube.FieldManager})
	if err != nil {
		return fmt.Errorf("update service %s: %w", ref, err)
	}
	return nil
}

// SetStopped writes spec.stopped.
func SetStopped(ctx context.Context, dyn dynamic.Interface, ref Ref, stopped bool) error {
	return patchSpec(ctx, dyn, ref, map[string]any{"stopped": stopped}, nil)
}

// SetMove writes the MoveAnnotation (to "" removes it).
func SetMove(ctx context.Context, dyn dynamic.Interface, ref Ref, to string) error {
	var v any = to
	if to == "" {
		v = nil
	}
	return patchSpec(ctx, dyn, ref, nil, map[string]any{MoveAnnotation: v})
}

// SetStorageClass writes spec.storageClass.
func SetStorageClass(ctx context.Context, dyn dynamic.Interface, ref Ref, class string) error {
	return patchSpec(ctx, dyn, ref, map[string]any{"storageClass": class}, nil)
}

// Pods lists the service's pods.
func Pods(ctx context.Context, cs kubernetes.Interface, s *Service) ([]corev1.Pod, error) {
	list, err := cs.CoreV1().Pods(s.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: Label + "=" + s.Name})
	if err != nil {
		return nil, fmt.Errorf("list the pods of service %s: %w", s.Ref, err)
	}
	return list.Items, nil
}

// StopTimeout and StartTimeout bound how long kip waits for console-api to stop or start a
// service: a database's own shutdown and start-up, an image pull, the volume's attach.
const (
	StopTimeout  = 5 * time.Minute
	StartTimeout = 10 * time.Minute
)

// WaitStopped waits until console-api reports the service Stopped for its current spec and no
// pod of the service is left, whatever its phase.
func WaitStopped(ctx context.Context, dyn dynamic.Interface, cs kubernetes.Interface, ref Ref, timeout time.Duration) error {
	return kube.PollPending(ctx, timeout, "service "+ref.String()+" to stop", func(ctx context.Context) (string, error) {
		s, err := Get(ctx, dyn, ref)
		if err != nil {
			return "", err
		}
		if p := s.pendingPhase(PhaseStopped); p != "" {
			return p, nil
		}
		pods, err := Pods(ctx, cs, s)
		if err != nil {
			return "", err
		}
		if len(pods) > 0 {
			return fmt.Sprintf("pod %s is still there (%s)", pods[0].Name, pods[0].Status.Phase), nil
		}
		return "", nil
	})
}

// WaitRunning waits until console-api reports the service Running for its current spec with
// its pod Ready.
func WaitRunning(ctx context.Context, dyn dynamic.Interface, cs kubernetes.Interface, ref Ref, timeout time.Duration) error {
	return kube.PollPending(ctx, timeout, "service "+ref.String()+" to be running", func(ctx context.Context) (string, error) {
		s, err := Get(ctx, dyn, ref)
		if err != nil {
			return "", err
		}
		if p := s.pendingPhase(PhaseRunning); p != "" {
			return p, nil
		}
		pods, err := Pods(ctx, cs, s)
		if err != nil {
			return "", err
		}
		for _, p := range pods {
			if p.DeletionTimestamp == nil && podutils.IsPodReady(&p) {
				return "", nil
			}
		}
		return "no pod of the service is Ready yet", nil
	})
}

func (s *Service) pendingPhase(want string) string {
	switch {
	case s.ObservedGeneration < s.Generation:
		return fmt.Sprintf("console-api has not acted on generation %d yet (it last saw %d)", s.Generation, s.ObservedGeneration)
	case s.Phase != want:
		return "console-api reports it " + orUnknown(s.Phase)
	}
	return ""
}

func orUnknown(phase string) string {
	if phase == "" {
		return "without a phase"
	}
	return phase
}
