package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	lhclient "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Manager is the manager of one node, as the longhorn-manager pod on it.
type Manager struct {
	Kube    kubernetes.Interface
	LH      lhclient.Interface
	Node    string
	Release Release
	// ServiceAccount runs the instance manager pods ("" for the namespace's default).
	ServiceAccount string
}

// Start is what the manager does as it starts: it refuses an upgrade path Longhorn refuses
// (CheckUpgradePath: the pod then ends, as Longhorn's does, and its DaemonSet does not roll out),
// then creates the release's settings, records the release and its images, deploys its engine
// image and from 1.10 on guards engine images against deletion.
func (m *Manager) Start(ctx context.Context) error {
	current, err := SettingValue(ctx, m.LH, SettingCurrentVersion)
	if err != nil {
		return err
	}
	images, err := m.LH.LonghornV1beta2().EngineImages(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if err := CheckUpgradePath(current, m.Release, images.Items); err != nil {
		return err
	}
	if err := EnsureSettings(ctx, m.LH, m.Release); err != nil {
		return err
	}
	for name, value := range map[string]string{
		SettingCurrentVersion:     m.Release.Version,
		SettingDefaultEngineImage: m.Release.EngineImage(),
		SettingDefaultIMImage:     m.Release.InstanceManagerImage(),
	} {
		if err := SetSetting(ctx, m.LH, name, func(string) string { return value }); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	if err := EnsureEngineImage(ctx, m.LH, m.Release, m.Node); err != nil {
		return err
	}
	if m.Release.GuardsEngineImages {
		return guardEngineImages(ctx, m.Kube)
	}
	return nil
}

// EnsureEngineImage creates release r's EngineImage, named as Longhorn names it, with its
// engine's API versions, deployed on node.
func EnsureEngineImage(ctx context.Context, c lhclient.Interface, r Release, node string) error {
	api := c.LonghornV1beta2().EngineImages(Namespace)
	name := EngineImageName(r.EngineImage())
	ei := &lh.EngineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}, Spec: lh.EngineImageSpec{Image: r.EngineImage()}}
	if _, err := api.Create(ctx, ei, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("engine image %s: %w", name, err)
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ei, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ei.Status.EngineVersionDetails = lh.EngineVersionDetails{Version: r.Version, CLIAPIVersion: r.CLIAPI, CLIAPIMinVersion: r.CLIAPIMin,
			ControllerAPIVersion: r.ControllerAPI, ControllerAPIMinVersion: r.ControllerAPIMin, DataFormatVersion: 1, DataFormatMinVersion: 1}
		deploy(ei, node)
		_, err = api.UpdateStatus(ctx, ei, metav1.UpdateOptions{})
		return err
	})
}

// deploy marks ei deployed on node, as its DaemonSet's pod there reports.
func deploy(ei *lh.EngineImage, node string) bool {
	if ei.Status.NodeDeploymentMap[node] && ei.Status.State == lh.EngineImageStateDeployed {
		return false
	}
	if ei.Status.NodeDeploymentMap == nil {
		ei.Status.NodeDeploymentMap = map[string]bool{}
	}
	ei.Status.NodeDeploymentMap[node] = true
	ei.Status.OwnerID, ei.Status.State = node, lh.EngineImageStateDeployed
	ei.Status.Conditions = []lh.Condition{{Type: lh.EngineImageConditionTypeReady, Status: lh.ConditionStatusTrue, LastTransitionTime: Now()}}
	return true
}

// Now is util.Now() of longhorn-manager: RFC3339 in UTC at one-second precision, the form of
// Longhorn's timestamps (healthyAt, noRefSince, conditions).
func Now() string { return time.Now().UTC().Format(time.RFC3339) }

// guardPolicy is the name of the policy (and its binding) that stands in for 1.10's engine image
// validator.
const guardPolicy = "longhorn-standin-engine-image-delete"

// guardEngineImages makes the API server refuse to delete an engine image in use or the default
// one, with the messages of Longhorn's validator (LM webhook/resources/engineimage/validator.go):
// a ValidatingAdmissionPolicy whose parameter is the default-engine-image setting. Longhorn's
// uninstall annotation that lets the default go is not modelled.
func guardEngineImages(ctx context.Context, kube kubernetes.Interface) error {
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: guardPolicy},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			ParamKind:     &admissionv1.ParamKind{APIVersion: "longhorn.io/v1beta2", Kind: "Setting"},
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Delete},
					Rule:       admissionv1.Rule{APIGroups: []string{"longhorn.io"}, APIVersions: []string{"*"}, Resources: []string{"engineimages"}},
				},
			}}},
			Validations: []admissionv1.Validation{
				{
					Expression:        "oldObject.spec.image != params.value",
					MessageExpression: `"deleting the default engine image " + params.value + " (" + oldObject.spec.image + ") is not allowed"`,
				},
				{
					Expression:        "!has(oldObject.status) || !has(oldObject.status.refCount) || oldObject.status.refCount == 0",
					MessageExpression: `"deleting engine image " + oldObject.metadata.name + " (" + oldObject.spec.image + ") is not allowed while being used"`,
				},
			},
		},
	}
	deny := admissionv1.DenyAction
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: guardPolicy},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        guardPolicy,
			ParamRef:          &admissionv1.ParamRef{Name: SettingDefaultEngineImage, Namespace: Namespace, ParameterNotFoundAction: &deny},
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	api := kube.AdmissionregistrationV1()
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the engine image guard: %w", err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the engine image guard's binding: %w", err)
	}
	return nil
}

// Reconcile is one pass of what the node's manager keeps: every engine image deployed on the
// node and reference-counted (volumes, engines and replicas naming it, as Longhorn counts), the
// release's instance manager running on the node as a pod with Longhorn's CPU request, and an
// older instance manager there removed once no running engine is in it.
func (m *Manager) Reconcile(ctx context.Context) error {
	return errors.Join(m.countImages(ctx), m.instanceManagers(ctx))
}

// countImages deploys every engine image on the node and sets its refCount (LM
// engine_image_controller.go countCRsUsingEngineImage) and noRefSince.
func (m *Manager) countImages(ctx context.Context) error {
	api := m.LH.LonghornV1beta2()
	vols, err := api.Volumes(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	engines, err := api.Engines(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	reps, err := api.Replicas(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	images, err := api.EngineImages(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for i := range images.Items {
		ei := &images.Items[i]
		image, refs := ei.Spec.Image, 0
		for _, v := range vols.Items {
			if v.Spec.Image == image || v.Status.CurrentImage == image {
				refs++
			}
		}
		for _, e := range engines.Items {
			if e.Spec.Image == image || e.Status.CurrentImage == image {
				refs++
			}
		}
		for _, r := range reps.Items {
			if r.Spec.Image == image || r.Status.CurrentImage == image {
				refs++
			}
		}
		changed := deploy(ei, m.Node)
		if ei.Status.RefCount != refs {
			ei.Status.RefCount, changed = refs, true
		}
		switch {
		case refs > 0 && ei.Status.NoRefSince != "":
			ei.Status.NoRefSince, changed = "", true
		case refs == 0 && ei.Status.NoRefSince == "":
			ei.Status.NoRefSince, changed = Now(), true
		}
		if changed {
			if _, err := api.EngineImages(Namespace).UpdateStatus(ctx, ei, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// instanceManagers keeps the node's instance managers: the default image's made and its pod
// running, the others deleted once no running engine on the node is in them.
func (m *Manager) instanceManagers(ctx context.Context) error {
	image, err := SettingValue(ctx, m.LH, SettingDefaultIMImage)
	if err != nil || image == "" {
		return err
	}
	api := m.LH.LonghornV1beta2()
	ims, err := api.InstanceManagers(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	engines, err := api.Engines(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for _, e := range engines.Items {
		if e.Status.CurrentState == lh.InstanceStateRunning && e.Status.InstanceManagerName != "" {
			inUse[e.Status.InstanceManagerName] = true
		}
	}
	want := InstanceManagerName(m.Node, image)
	var errs []error
	found := false
	for i := range ims.Items {
		im := &ims.Items[i]
		if im.Spec.NodeID != m.Node {
			continue
		}
		if im.Name == want {
			found = true
			errs = append(errs, m.keepPod(ctx, im))
			continue
		}
		if inUse[im.Name] {
			continue
		}
		if err := m.Kube.CoreV1().Pods(Namespace).Delete(ctx, im.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
			continue
		}
		if err := api.InstanceManagers(Namespace).Delete(ctx, im.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if !found {
		im := &lh.InstanceManager{
			ObjectMeta: metav1.ObjectMeta{Name: want, Namespace: Namespace, Labels: m.labels(image)},
			Spec:       lh.InstanceManagerSpec{Image: image, NodeID: m.Node, Type: lh.InstanceManagerTypeAllInOne, DataEngine: lh.DataEngineTypeV1},
		}
		im, err := api.InstanceManagers(Namespace).Create(ctx, im, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return errors.Join(append(errs, err)...)
		}
		if err == nil {
			errs = append(errs, m.keepPod(ctx, im))
		}
	}
	return errors.Join(errs...)
}

// labels are an instance manager's and its pod's (LM types.GetInstanceManagerLabels).
func (m *Manager) labels(image string) map[string]string {
	return map[string]string{
		"longhorn.io/managed-by":             "longhorn-manager",
		"longhorn.io/component":              "instance-manager",
		"longhorn.io/instance-manager-type":  string(lh.InstanceManagerTypeAllInOne),
		"longhorn.io/node":                   m.Node,
		"longhorn.io/instance-manager-image": InstanceManagerImageLabel(image),
		"longhorn.io/data-engine":            string(lh.DataEngineTypeV1),
	}
}

// keepPod makes im's pod when it has none, bound to its node by nodeName (so the kubelet
// admits it by its requests, or refuses it) with the CPU request Longhorn gives it, and reports
// the pod's state on im: running once it runs, error once it failed, else starting. A pod that
// ended is made again on the next pass, as Longhorn's instance manager controller does.
func (m *Manager) keepPod(ctx context.Context, im *lh.InstanceManager) error {
	pods := m.Kube.CoreV1().Pods(Namespace)
	pod, err := pods.Get(ctx, im.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cpu, err := m.cpuRequest(ctx)
		if err != nil {
			return err
		}
		pod = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: im.Name, Namespace: Namespace, Labels: m.labels(im.Spec.Image)},
			Spec: corev1.PodSpec{
				NodeName:           im.Spec.NodeID,
				ServiceAccountName: m.ServiceAccount,
				RestartPolicy:      corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "instance-manager", Image: im.Spec.Image, ImagePullPolicy: corev1.PullIfNotPresent,
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI)}},
				}},
			},
		}
		if pod, err = pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("instance manager pod %s: %w", im.Name, err)
		}
	} else if err != nil {
		return err
	}
	state := lh.InstanceManagerStateStarting
	switch pod.Status.Phase {
	case corev1.PodRunning:
		state = lh.InstanceManagerStateRunning
	case corev1.PodFailed, corev1.PodSucceeded:
		state = lh.InstanceManagerStateError
		// Made again on the next pass.
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if im.Status.CurrentState == state && im.Status.OwnerID == m.Node {
		return nil
	}
	im.Status.CurrentState, im.Status.OwnerID = state, m.Node
	_, err = m.LH.LonghornV1beta2().InstanceManagers(Namespace).UpdateStatus(ctx, im, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // the next pass
	}
	return err
}

// cpuRequest is the instance manager's CPU request on the node, in millicores (LM
// controller/controller_manager.go GetInstanceManagerCPURequirement): the Longhorn Node's
// instanceManagerCPURequest when set, else the guaranteed-instance-manager-cpu share (a float,
// the v1 engine's value from 1.10 on) of the node's allocatable CPU, rounded.
func (m *Manager) cpuRequest(ctx context.Context) (int64, error) {
	node, err := m.LH.LonghornV1beta2().Nodes(Namespace).Get(ctx, m.Node, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("Longhorn node %s: %w", m.Node, err)
	}
	if node.Spec.InstanceManagerCPURequest != 0 {
		return int64(node.Spec.InstanceManagerCPURequest), nil
	}
	kn, err := m.Kube.CoreV1().Nodes().Get(ctx, m.Node, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	value, err := SettingValue(ctx, m.LH, SettingManagerCPU)
	if err != nil {
		return 0, err
	}
	percent, err := m.Release.v1Float(value)
	if err != nil {
		return 0, fmt.Errorf("setting %s: %w", SettingManagerCPU, err)
	}
	return int64(math.Round(float64(kn.Status.Allocatable.Cpu().MilliValue()) * percent / 100)), nil
}

// v1Float is a data-engine-specific setting's value for the v1 data engine, as r reads it: the
// plain value up to 1.9, the JSON object's "v1" from 1.10 on.
func (r Release) v1Float(value string) (float64, error) {
	if r.PerEngine {
		var engines map[string]string
		if err := json.Unmarshal([]byte(value), &engines); err != nil {
			return 0, err
		}
		value = engines[string(lh.DataEngineTypeV1)]
	}
	return strconv.ParseFloat(strings.TrimSpace(value), 64)
}
