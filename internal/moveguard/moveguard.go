// Package moveguard is a move's admission guard: it keeps every pod but a move's own off a
// service's volumes, and keeps the service's namespace from being deleted, while kip moves the
// service's data: two ValidatingAdmissionPolicies that kip install applies (Policies) and the
// per-move objects that switch them on (Guard). The API server enforces both for every user,
// cluster admins included; kip checks each one refuses a dry-run request before it stops the
// service (CheckEnforced).
package moveguard

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
)

const (
	// VolumesPolicy refuses a pod that mounts a guarded claim, unless kip named the pod in the guard.
	VolumesPolicy = "kipper-storage-move-volumes"
	// NamespacesPolicy refuses to delete a namespace with a NamespaceLabel.
	NamespacesPolicy = "kipper-storage-move-namespaces"

	// MoveLabel, on a guard's ConfigMap, selects it as the volumes policy's parameters; its
	// value is the service's name.
	MoveLabel = "kipper.run/storage-move"
	// namespaceLabelPrefix starts a namespace's label while the move of one of its services runs:
	// storage-move.kipper.run/<service>. Each move has its own, so that several can be unfinished
	// in one namespace.
	namespaceLabelPrefix = "storage-move.kipper.run/"

	// The guard ConfigMap's keys: space-separated claim and pod names, the service's name, the
	// command that shows the move, and whether the service was stopped before it.
	claimsKey  = "claims"
	podsKey    = "pods"
	serviceKey = "service"
	infoKey    = "info"
	stoppedKey = "wasStopped"
)

// ConfigMapName is the guard's parameters for the move of service.
func ConfigMapName(service string) string { return "kip-storage-move-" + service }

// volumesCheck is the volumes policy's rule. A pod without volumes passes; one that mounts a
// claim the guard names passes only when the guard names the pod too.
const volumesCheck = `!has(object.spec.volumes) ||
!object.spec.volumes.exists(v, has(v.persistentVolumeClaim) && v.persistentVolumeClaim.claimName in params.data.claims.split(' ')) ||
object.metadata.name in params.data.pods.split(' ')`

const volumesMessage = `'kip is moving the data of service ' + params.data.service + ' in ' + namespaceObject.metadata.name +
' to Longhorn: no pod may mount its volumes (' + params.data.claims + ') until the move finishes or is rolled back (' +
params.data.info + ' shows it)'`

const namespacesCheck = `!has(oldObject.metadata.labels) || !oldObject.metadata.labels.exists(k, k.startsWith('` + namespaceLabelPrefix + `'))`

var namespacesMessage = `'namespace ' + oldObject.metadata.name + ' cannot be deleted while kip moves the data of ' +
oldObject.metadata.labels.filter(k, k.startsWith('` + namespaceLabelPrefix + `')).map(k, 'service ' + k.substring(` + strconv.Itoa(len(namespaceLabelPrefix)) + `)).join(', ') +
' to Longhorn; it can be once the move finishes or is rolled back'`

// NamespaceLabel is the label a namespace carries while service's move is unfinished.
func NamespaceLabel(service string) string { return namespaceLabelPrefix + service }

// Policies are the two policies and their bindings, as kip install applies them.
func Policies() []runtime.Object {
	pods := admissionv1.RuleWithOperations{
		Operations: []admissionv1.OperationType{admissionv1.Create},
		Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
	}
	namespaces := admissionv1.RuleWithOperations{
		Operations: []admissionv1.OperationType{admissionv1.Delete},
		Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"namespaces"}},
	}
	policy := metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"}
	binding := metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"}
	return []runtime.Object{
		&admissionv1.ValidatingAdmissionPolicy{
			TypeMeta:   policy,
			ObjectMeta: metav1.ObjectMeta{Name: VolumesPolicy},
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				FailurePolicy:    ptr.To(admissionv1.Fail),
				ParamKind:        &admissionv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
				MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: pods}}},
				Validations:      []admissionv1.Validation{{Expression: volumesCheck, MessageExpression: volumesMessage, Reason: ptr.To(metav1.StatusReasonForbidden)}},
			},
		},
		&admissionv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   binding,
			ObjectMeta: metav1.ObjectMeta{Name: VolumesPolicy},
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        VolumesPolicy,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
				// No namespace: the parameters are the guard ConfigMaps in the pod's own namespace,
				// and a namespace without one admits every pod.
				ParamRef: &admissionv1.ParamRef{
					Selector:                &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: MoveLabel, Operator: metav1.LabelSelectorOpExists}}},
					ParameterNotFoundAction: ptr.To(admissionv1.AllowAction),
				},
			},
		},
		&admissionv1.ValidatingAdmissionPolicy{
			TypeMeta:   policy,
			ObjectMeta: metav1.ObjectMeta{Name: NamespacesPolicy},
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				FailurePolicy:    ptr.To(admissionv1.Fail),
				MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: namespaces}}},
				Validations:      []admissionv1.Validation{{Expression: namespacesCheck, MessageExpression: namespacesMessage, Reason: ptr.To(metav1.StatusReasonForbidden)}},
			},
		},
		&admissionv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   binding,
			ObjectMeta: metav1.ObjectMeta{Name: NamespacesPolicy},
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        NamespacesPolicy,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			},
		},
	}
}

// Guard is what keeps a service's volumes to the move's own pods.
type Guard struct {
	Namespace string
	// Service is the Kipper service whose data moves.
	Service string
	// Claims are the claims no other pod may mount: the service's and the move's new one.
	Claims []string
	// Pods are the move's own pods, the only ones that may mount Claims.
	Pods []string
	// Info is the command that shows the service and its move, for the policy's refusal.
	Info string
	// WasStopped says that the service was stopped before the move, so that a rollback that
	// lost the move's record still leaves it stopped (ReadWasStopped).
	WasStopped bool
}

// ConfigMap is the guard as the volumes policy's parameters.
func (g Guard) ConfigMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName(g.Service), Namespace: g.Namespace,
			Labels: map[string]string{MoveLabel: g.Service, "app.kubernetes.io/managed-by": "kip"}},
		Data: map[string]string{
			claimsKey:  strings.Join(g.Claims, " "),
			podsKey:    strings.Join(g.Pods, " "),
			serviceKey: g.Service,
			infoKey:    g.Info,
			stoppedKey: strconv.FormatBool(g.WasStopped),
		},
	}
}

// Put writes the guard (creates or replaces its ConfigMap) and labels the namespace so that it
// cannot be deleted. A namespace already being deleted is refused before anything changes.
func (g Guard) Put(ctx context.Context, cs kubernetes.Interface) error {
	ns, err := cs.CoreV1().Namespaces().Get(ctx, g.Namespace, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", g.Namespace, err)
	}
	if ns.DeletionTimestamp != nil {
		return fmt.Errorf("namespace %s is being deleted: its services cannot move", g.Namespace)
	}
	want := g.ConfigMap()
	cms := cs.CoreV1().ConfigMaps(g.Namespace)
	if _, err := cms.Create(ctx, want, metav1.CreateOptions{FieldManager: kube.FieldManager}); apierrors.IsAlreadyExists(err) {
		err = replace(ctx, cs, want)
	} else if err != nil {
		return fmt.Errorf("write the fence of %s/%s: %w", g.Namespace, g.Service, err)
	}
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"longhorn"}}}`, NamespaceLabel(g.Service))
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, g.Namespace, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("label namespace %s as under move: %w", g.Namespace, err)
	}
	return nil
}

func replace(ctx context.Context, cs kubernetes.Interface, want *corev1.ConfigMap) error {
	cms := cs.CoreV1().ConfigMaps(want.Namespace)
	live, err := cms.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the fence %s/%s: %w", want.Namespace, want.Name, err)
	}
	live.Labels, live.Data = want.Labels, want.Data
	if _, err := cms.Update(ctx, live, metav1.UpdateOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("write the fence %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}

// ReadWasStopped reads from the guard of service's move whether the service was stopped before
// it; found is false when there is no guard.
func ReadWasStopped(ctx context.Context, cs kubernetes.Interface, namespace, service string) (stopped, found bool, err error) {
	cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, ConfigMapName(service), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("read the fence of %s/%s: %w", namespace, service, err)
	}
	return cm.Data[stoppedKey] == "true", true, nil
}

// Lift removes the guard and the namespace's label. Removing what is already gone is no error.
func Lift(ctx context.Context, cs kubernetes.Interface, namespace, service string) error {
	err := cs.CoreV1().ConfigMaps(namespace).Delete(ctx, ConfigMapName(service), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the fence of %s/%s: %w", namespace, service, err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	if _, ok := ns.Labels[NamespaceLabel(service)]; !ok {
		return nil
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, NamespaceLabel(service))
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, namespace, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: kube.FieldManager}); err != nil {
		return fmt.Errorf("remove the move label of namespace %s: %w", namespace, err)
	}
	return nil
}

// Lifted reports whether nothing of service's guard is left: neither its ConfigMap nor its
// namespace's label. A guard put only in part (its ConfigMap, not yet the label) is not lifted.
func Lifted(ctx context.Context, cs kubernetes.Interface, namespace, service string) (bool, error) {
	_, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, ConfigMapName(service), metav1.GetOptions{})
	switch {
	case err == nil:
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("read the fence of %s/%s: %w", namespace, service, err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read namespace %s: %w", namespace, err)
	}
	_, labelled := ns.Labels[NamespaceLabel(service)]
	return !labelled, nil
}

// Intact reports what is missing from f as it was put ("" when the guard still holds): a guard
// whose ConfigMap was deleted or changed, or whose namespace lost its label, no longer protected
// the volumes while kip was away.
func (g Guard) Intact(ctx context.Context, cs kubernetes.Interface) (string, error) {
	cm, err := cs.CoreV1().ConfigMaps(g.Namespace).Get(ctx, ConfigMapName(g.Service), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("the fence ConfigMap %s/%s is gone", g.Namespace, ConfigMapName(g.Service)), nil
	case err != nil:
		return "", fmt.Errorf("read the fence of %s/%s: %w", g.Namespace, g.Service, err)
	}
	want := g.ConfigMap()
	if cm.Labels[MoveLabel] != g.Service || !maps.Equal(cm.Data, want.Data) {
		return fmt.Sprintf("the fence ConfigMap %s/%s was changed", g.Namespace, cm.Name), nil
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, g.Namespace, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read namespace %s: %w", g.Namespace, err)
	}
	if _, ok := ns.Labels[NamespaceLabel(g.Service)]; !ok {
		return fmt.Sprintf("namespace %s lost its label %s", g.Namespace, NamespaceLabel(g.Service)), nil
	}
	return "", nil
}

// EnforceTimeout bounds how long CheckEnforced waits for the API server to start enforcing a new
// guard: the admission plugin sees new parameters through its informer, within a second or two.
const EnforceTimeout = 30 * time.Second

// ProbePod is the pod CheckEnforced asks the API server to create, in a dry run.
const ProbePod = "kip-fence-probe"

// CheckEnforced proves that the API server enforces f: a dry-run create of a pod mounting each
// guarded claim, and a dry-run delete of the namespace, must both be refused by kip's policies. It
// waits up to EnforceTimeout for a guard just put to take effect, and names what was not refused.
func CheckEnforced(ctx context.Context, cs kubernetes.Interface, g Guard, timeout time.Duration) error {
	if slices.Contains(g.Pods, ProbePod) {
		return fmt.Errorf("the fence of %s/%s names the probe pod %s as a move pod", g.Namespace, g.Service, ProbePod)
	}
	dry := []string{metav1.DryRunAll}
	return kube.Poll(ctx, timeout, fmt.Sprintf("the API server to enforce the fence of %s/%s (policies %s and %s)", g.Namespace, g.Service, VolumesPolicy, NamespacesPolicy),
		func(ctx context.Context) (bool, string, error) {
			for _, claim := range g.Claims {
				_, err := cs.CoreV1().Pods(g.Namespace).Create(ctx, probePod(g.Namespace, claim), metav1.CreateOptions{DryRun: dry})
				if pending, err := refused(err, VolumesPolicy); pending != "" || err != nil {
					return false, fmt.Sprintf("a pod mounting claim %s: %s", claim, pending), err
				}
			}
			err := cs.CoreV1().Namespaces().Delete(ctx, g.Namespace, metav1.DeleteOptions{DryRun: dry})
			if pending, err := refused(err, NamespacesPolicy); pending != "" || err != nil {
				return false, fmt.Sprintf("deleting namespace %s: %s", g.Namespace, pending), err
			}
			return true, "", nil
		})
}

// refused reports "" when err is policy's refusal, or what happened instead.
func refused(err error, policy string) (string, error) {
	switch {
	case err == nil:
		return "allowed (dry run)", nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		if strings.Contains(err.Error(), policy) {
			return "", nil
		}
		return "refused, but not by " + policy + ": " + err.Error(), nil
	}
	return "", err
}

func probePod(namespace, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ProbePod, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "probe", Image: "kip.invalid/probe"}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}
