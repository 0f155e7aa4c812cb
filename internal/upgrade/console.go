package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
)

// The console layer (spec 002, step 2): console-api and the console restarted onto their images,
// console-api with the pod hardening this kip ships, and each waited for until its new pods run
// alone. Only those fields are applied, by their own field manager: the Deployment's manifest
// does not move, and whatever an operator added to it (an extra volume) stays.
const (
	// upgradeFieldManager owns the fields the upgrade applies to the console's Deployments.
	upgradeFieldManager = "kip-upgrade"
	// upgradedAtAnnotation on a console Deployment's pod template restarts its pods onto their
	// image (pulled on every start); its value is the upgrade's, so that a resumed upgrade does
	// not restart them twice.
	upgradedAtAnnotation = "kipper.run/upgraded-at"
	// consoleRolloutTimeout bounds the wait for a console Deployment's new pods.
	consoleRolloutTimeout = 10 * time.Minute
	consoleNamespace      = "kipper-system"
)

// consoleDeployments are the console layer's Deployments in the order the upgrade restarts
// them; console-api alone gets the pod hardening.
var consoleDeployments = []struct {
	name   string
	harden bool
}{{"console-api", true}, {"console", false}}

// consoleSteps restart each console Deployment of the rendered console component onto its image
// (with imageTag, a commit's), marked with token.
func consoleSteps(cl *kube.Clients, console components.Component, imageTag, token string) ([]workflow.Step, error) {
	var steps []workflow.Step
	for _, cd := range consoleDeployments {
		rendered := findObject(console.Objects, "Deployment", cd.name)
		if rendered == nil {
			return nil, fmt.Errorf("kip renders no Deployment %s", cd.name)
		}
		want, image, err := consoleApply(rendered, cd.harden, imageTag, token)
		if err != nil {
			return nil, err
		}
		steps = append(steps, restartStep(cl, want, image))
	}
	return steps, nil
}

// restartStep applies want (a console Deployment's upgraded fields) and waits until the
// Deployment's new pods serve alone; a new pod that cannot start fails it, named with its reason.
func restartStep(cl *kube.Clients, want *unstructured.Unstructured, image string) workflow.Step {
	name, ns := want.GetName(), want.GetNamespace()
	title := fmt.Sprintf("Restart %s on %s", name, image)
	drift := func(ctx context.Context) ([]string, error) {
		return kube.Drift(ctx, cl, []*unstructured.Unstructured{want}, upgradeFieldManager)
	}
	return workflow.Step{
		Name: "console-" + name, Title: title,
		Done: fmt.Sprintf("%s restarted: its new pods run alone", name), Already: name + " already restarted by this upgrade",
		Check: func(ctx context.Context) (bool, error) {
			d, err := drift(ctx)
			if err != nil || len(d) > 0 {
				return false, err
			}
			done, _, err := kube.ServingAlone(ctx, cl, ns, name)
			return done, err
		},
		Plan: func(ctx context.Context) ([]string, error) {
			d, err := drift(ctx)
			return append(d, "wait until its new pods run and no old pod remains"), err
		},
		Apply: func(ctx context.Context) error {
			d, err := drift(ctx)
			if err != nil {
				return err
			}
			if len(d) > 0 {
				if strings.HasSuffix(d[0], ": missing") {
					return fmt.Errorf("Deployment %s/%s is missing: kip upgrade restarts the console's Deployments but does not create them; run kip install again to put them back", ns, name)
				}
				if err := kube.Apply(ctx, cl, []*unstructured.Unstructured{want}, kube.ApplyOptions{FieldManager: upgradeFieldManager, Force: true}); err != nil {
					return err
				}
			}
			return kube.WaitServingAlone(ctx, cl, ns, name, consoleRolloutTimeout)
		},
	}
}

// consoleApply is what the upgrade applies to the rendered console Deployment: its container's
// image (with imageTag instead of the pinned tag), the restart token on its pod template, and
// with harden the pod's and the container's security settings with the /tmp volume a read-only
// root filesystem needs; and the image.
func consoleApply(rendered *unstructured.Unstructured, harden bool, imageTag, token string) (*unstructured.Unstructured, string, error) {
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rendered.Object, &d); err != nil {
		return nil, "", fmt.Errorf("Deployment %s: %w", rendered.GetName(), err)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		return nil, "", fmt.Errorf("Deployment %s: kip renders %d containers, the upgrade restarts one", d.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	image := c.Image
	if imageTag != "" {
		image = image[:strings.LastIndex(image, ":")] + ":" + imageTag
	}
	container := map[string]any{"name": c.Name, "image": image}
	spec := map[string]any{"containers": []any{container}}
	if harden {
		fields := []struct {
			into map[string]any
			key  string
			v    any
		}{
			{container, "securityContext", c.SecurityContext}, {container, "volumeMounts", c.VolumeMounts},
			{spec, "securityContext", pod.SecurityContext}, {spec, "volumes", pod.Volumes},
		}
		for _, f := range fields {
			v, err := plain(f.v)
			if err != nil {
				return nil, "", fmt.Errorf("Deployment %s: %w", d.Name, err)
			}
			f.into[f.key] = v
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": d.Name, "namespace": d.Namespace},
		"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{upgradedAtAnnotation: token}},
			"spec":     spec,
		}},
	}}
	return u, image, nil
}

// plain turns a typed value into JSON's plain form, as an unstructured object holds it.
func plain(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(b, &out)
}

// findObject finds the object of kind and name among objs.
func findObject(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}
