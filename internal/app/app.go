// Package app is kip's side of the contract with console-api about a Kipper app
// (apps.kipper.run): kip writes a few fields of the App object and console-api runs the app as
// the Deployment of the same name; kip never edits that Deployment itself. docs/console.md
// documents the contract, which the lab's console stand-in (test/console-standin) follows.
//
// What kip writes, and what console-api does with it:
//   - spec.replicas, the stored count: the Deployment's count while autoscaling is off and the
//     app is not stopped. It lies within the autoscaling bounds, whether autoscaling is on or off.
//   - spec.autoscale (enabled, minReplicas, maxReplicas, cpuTarget, memoryTarget): while enabled,
//     an autoscaler moves the Deployment's count within the bounds towards the targets.
//   - spec.stop {reason, at}: present while the app is stopped; the Deployment goes to 0 replicas.
//     Removed, the app starts at its stored count, or at its minimum when autoscaling is on.
//   - the annotation kipper.run/restart-requested-at (an RFC 3339 time): console-api copies it
//     onto the Deployment's pod template as kipper.run/restarted-at, so the pods roll.
//
// What console-api reports, which kip reads: status.phase (Starting, Running, Stopping, Stopped),
// status.replicas and status.readyReplicas (the Deployment's), and status.observedGeneration, the
// generation it last acted on.
package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/service"
)

// AppsGVR is Kipper's App.
var AppsGVR = schema.GroupVersionResource{Group: "kipper.run", Version: "v1alpha1", Resource: "apps"}

const (
	// Label is on every pod of an app, with the app's name; the Deployment selects its pods by
	// it.
	Label = "kipper.run/app"
	// RestartAnnotation on an App asks console-api to roll its pods; its value is the time of
	// the request (RFC 3339).
	RestartAnnotation = "kipper.run/restart-requested-at"
	// RestartedAnnotation is on the Deployment's pod template, copied from RestartAnnotation.
	RestartedAnnotation = "kipper.run/restarted-at"
	// StopReason is the reason kip app stop records.
	StopReason = "stopped with kip app stop"

	// Phases console-api reports in status.phase.
	PhaseRunning  = "Running"
	PhaseStarting = "Starting"
	PhaseStopping = "Stopping"
	PhaseStopped  = "Stopped"
)

// StopRecord is an App's spec.stop: why and since when it is stopped.
type StopRecord struct {
	Reason string `json:"reason"`
	At     string `json:"at,omitempty"`
}

// App is a Kipper app as kip reads it.
type App struct {
	service.Ref
	Image string
	// Replicas is the stored count (spec.replicas), 0 when unset (as the upgrade's check
	// reads it).
	Replicas  int32
	Autoscale Autoscale
	// Stop is spec.stop, nil while the app is not stopped.
	Stop *StopRecord
	// Restart is the RestartAnnotation's value, "" when none was asked for.
	Restart string
	// Phase, StatusReplicas, ReadyReplicas and ObservedGeneration are console-api's report;
	// Generation the object's.
	Phase              string
	StatusReplicas     int32
	ReadyReplicas      int32
	ObservedGeneration int64
	Generation         int64
	// Object is the App as read: the commands' writes test what they read of it (its generation,
	// or the stop kip app start removes), so that a change made meanwhile fails the write instead
	// of being overwritten.
	Object *unstructured.Unstructured
}

// Deployment is the name of the app's Deployment.
func (a *App) Deployment() string { return a.Name }

// Stopped reports whether spec.stop is present.
func (a *App) Stopped() bool { return a.Stop != nil }

// Get reads the app ref names, refusing a project, environment or app that does not exist.
func Get(ctx context.Context, dyn dynamic.Interface, ref service.Ref) (*App, error) {
	if err := service.CheckEnvironment(ctx, dyn, ref.Project, ref.Environment); err != nil {
		return nil, err
	}
	u, err := dyn.Resource(AppsGVR).Namespace(ref.Namespace()).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		names, lerr := kube.Names(ctx, dyn, AppsGVR, ref.Namespace())
		if lerr != nil {
			return nil, lerr
		}
		return nil, fmt.Errorf("no app %s in %s (project %s, environment %s; apps there: %s): check the name with kubectl get apps.kipper.run -n %s",
			ref.Name, ref.Namespace(), ref.Project, ref.Environment, cli.OrNone(strings.Join(names, ", ")), ref.Namespace())
	}
	if err != nil {
		return nil, fmt.Errorf("read app %s: %w", ref, err)
	}
	return FromObject(ref, u)
}

// FromObject reads an App object.
func FromObject(ref service.Ref, u *unstructured.Unstructured) (*App, error) {
	var obj struct {
		Spec struct {
			Image     string      `json:"image"`
			Replicas  int32       `json:"replicas"`
			Autoscale Autoscale   `json:"autoscale"`
			Stop      *StopRecord `json:"stop"`
		} `json:"spec"`
		Status struct {
			Phase              string `json:"phase"`
			Replicas           int32  `json:"replicas"`
			ReadyReplicas      int32  `json:"readyReplicas"`
			ObservedGeneration int64  `json:"observedGeneration"`
		} `json:"status"`
	}
	raw, err := json.Marshal(u.Object)
	if err == nil {
		err = json.Unmarshal(raw, &obj)
	}
	if err != nil {
		return nil, fmt.Errorf("read app %s: %w", ref, err)
	}
	return &App{Ref: ref, Image: obj.Spec.Image, Replicas: obj.Spec.Replicas, Autoscale: obj.Spec.Autoscale, Stop: obj.Spec.Stop,
		Restart: u.GetAnnotations()[RestartAnnotation], Phase: obj.Status.Phase, StatusReplicas: obj.Status.Replicas,
		ReadyReplicas: obj.Status.ReadyReplicas, ObservedGeneration: obj.Status.ObservedGeneration, Generation: u.GetGeneration(),
		Object: u}, nil
}

// GetDeployment reads the app's Deployment, nil when it does not exist.
func GetDeployment(ctx context.Context, cs kubernetes.Interface, a *App) (*appsv1.Deployment, error) {
	d, err := cs.AppsV1().Deployments(a.Namespace()).Get(ctx, a.Deployment(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read Deployment %s/%s: %w", a.Namespace(), a.Deployment(), err)
	}
	return d, nil
}

// Pods lists the app's pods: those the Deployment d selects, or those with the app's Label when
// there is no Deployment (d nil).
func Pods(ctx context.Context, cs kubernetes.Interface, a *App, d *appsv1.Deployment) ([]corev1.Pod, error) {
	selector := Label + "=" + a.Name
	if d != nil && d.Spec.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("the selector of Deployment %s/%s: %w", d.Namespace, d.Name, err)
		}
		selector = s.String()
	}
	list, err := cs.CoreV1().Pods(a.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list the pods of app %s: %w", a.Ref, err)
	}
	return list.Items, nil
}

// Timeouts bound how long kip waits for console-api to act on an app and for its pods: a stop
// ends with the pods' grace period; a start, scale or restart waits for new pods, with their
// image pulls and readiness checks.
const (
	StopTimeout    = 2 * time.Minute
	StartTimeout   = 5 * time.Minute
	RestartTimeout = 5 * time.Minute
)

// since formats spec.stop.at for a message: "since <at>", or "" when unset.
func (s *StopRecord) since() string {
	if s.At == "" {
		return ""
	}
	return " since " + s.At
}

func (s *StopRecord) String() string {
	reason := s.Reason
	if reason == "" {
		reason = "no reason recorded"
	}
	return reason + s.since()
}

// Listed is an App of a project's environment, as ListInProjects read it.
type Listed struct {
	Project, Environment string
	Object               *unstructured.Unstructured
}

// ListInProjects lists every App of the cluster's project namespaces in two API requests
// whatever their number: the project namespaces and the Apps, each listed once. outside counts
// the Apps of namespaces no project has. A cluster without Kipper's App CRD has no apps.
func ListInProjects(ctx context.Context, cl *kube.Clients) (apps []Listed, outside int, err error) {
	nss, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: service.ProjectLabel})
	if err != nil {
		return nil, 0, fmt.Errorf("list the project namespaces: %w", err)
	}
	project := map[string]string{}
	for _, ns := range nss.Items {
		project[ns.Name] = ns.Labels[service.ProjectLabel]
	}
	list, err := cl.Dynamic.Resource(AppsGVR).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("list the apps: %w", err)
	}
	for i := range list.Items {
		u := &list.Items[i]
		p, ok := project[u.GetNamespace()]
		if !ok || !strings.HasPrefix(u.GetNamespace(), p+"-") {
			outside++
			continue
		}
		apps = append(apps, Listed{Project: p, Environment: strings.TrimPrefix(u.GetNamespace(), p+"-"), Object: u})
	}
	return apps, outside, nil
}
