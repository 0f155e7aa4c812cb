package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"kipper.run/kip/internal/fault"
)

// Waits poll the API server every half second (apimachinery's wait) until the condition holds,
// the timeout passes or ctx ends. The timeout error names what is still pending, e.g.
//
//	timed out after 2m0s waiting for rollout: Deployment kipper-system/console-api has 1 of 2 replicas updated, 0 available
//
// Errors that waiting cannot cure (forbidden, a rollout past its progress deadline) end the wait
// at once; others (not found yet, a dropped connection) are retried and reported as pending.

// PollInterval is how often a wait asks again (a test build may ask more often: fault.Interval).
const PollInterval = 500 * time.Millisecond

// Check reports whether the awaited condition holds and, if not, what is pending. An error ends
// the wait.
type Check func(ctx context.Context) (done bool, pending string, err error)

// Poll waits until fn reports done, fn fails, the timeout passes or ctx ends.
func Poll(ctx context.Context, timeout time.Duration, what string, fn Check) error {
	pending := "nothing observed yet"
	var failed error
	err := wait.PollUntilContextTimeout(ctx, fault.Interval(PollInterval), timeout, true, func(context.Context) (bool, error) {
		done, p, err := check(ctx, fn)
		if err != nil && ctx.Err() == nil {
			failed = fmt.Errorf("wait for %s: %w", what, err)
			return false, failed
		}
		if p != "" {
			pending = p
		}
		return err == nil && done, nil
	})
	switch {
	case err == nil:
		return nil
	case failed != nil:
		return failed
	case ctx.Err() != nil:
		return fmt.Errorf("stopped waiting for %s: %w; %s", what, ctx.Err(), pending)
	}
	return fmt.Errorf("timed out after %s waiting for %s: %s", timeout, what, pending)
}

// checkTimeout bounds one check of a wait.
const checkTimeout = 30 * time.Second

// check runs fn once. A deadline of ctx (the wait's or the caller's) does not cut a check short:
// it completes, within checkTimeout, and says what is really pending, where the client's rate
// limiter would have refused a request that might outlast the deadline. Cancelling ctx (Ctrl-C)
// does stop it.
func check(ctx context.Context, fn Check) (bool, string, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	defer stop()
	return fn(cctx)
}

// PollPending waits until pending reports nothing pending ("").
func PollPending(ctx context.Context, timeout time.Duration, what string, pending func(context.Context) (string, error)) error {
	return Poll(ctx, timeout, what, func(ctx context.Context) (bool, string, error) {
		p, err := pending(ctx)
		return err == nil && p == "", p, err
	})
}

// retryable reports whether an API error may go away by itself while waiting.
func retryable(err error) bool {
	return !(apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err))
}

// PendingGet turns the error of a Get into a pending description, or returns it when waiting
// cannot help.
func PendingGet(what string, err error) (string, error) {
	if apierrors.IsNotFound(err) {
		return what + " not found", nil
	}
	if retryable(err) {
		return fmt.Sprintf("get %s: %v", what, err), nil
	}
	return "", fmt.Errorf("get %s: %w", what, err)
}

// WaitCRDsEstablished waits until every named CustomResourceDefinition is Established. A CRD
// whose names the API server refused fails at once.
func WaitCRDsEstablished(ctx context.Context, c *Clients, names []string, timeout time.Duration) error {
	if len(names) == 0 {
		return nil
	}
	return Poll(ctx, timeout, "CRDs to be established", func(ctx context.Context) (bool, string, error) {
		var pending []string
		for _, name := range names {
			crd, err := c.APIExt.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				p, err := PendingGet("CRD "+name, err)
				if err != nil {
					return false, "", err
				}
				pending = append(pending, p)
				continue
			}
			established, refused := crdStatus(crd)
			if refused != "" {
				return false, "", fmt.Errorf("CRD %s: names not accepted: %s", name, refused)
			}
			if !established {
				pending = append(pending, "CRD "+name+" not established")
			}
		}
		return len(pending) == 0, strings.Join(pending, ", "), nil
	})
}

func crdStatus(crd *apiextensionsv1.CustomResourceDefinition) (established bool, refused string) {
	for _, cond := range crd.Status.Conditions {
		switch {
		case cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue:
			established = true
		case cond.Type == apiextensionsv1.NamesAccepted && cond.Status == apiextensionsv1.ConditionFalse:
			refused = cond.Message
		}
	}
	return established, refused
}

// WaitRollout waits until a Deployment, DaemonSet or StatefulSet has rolled out, judged as
// kubectl rollout status does: the controller has observed the latest spec, every replica is
// updated, old ones are gone, and the updated ones are available (ready, for a StatefulSet). A
// Deployment past its progress deadline fails at once, as does a DaemonSet or StatefulSet whose
// update strategy is not RollingUpdate (its rollout has no end to wait for).
func WaitRollout(ctx context.Context, c *Clients, kind, namespace, name string, timeout time.Duration) error {
	if _, err := workloadGetter(c, kind, namespace); err != nil {
		return fmt.Errorf("wait for rollout of %s %s/%s: %w", kind, namespace, name, err)
	}
	id := kind + " " + namespace + "/" + name
	return Poll(ctx, timeout, "rollout", func(ctx context.Context) (bool, string, error) {
		obj, err := GetWorkload(ctx, c, kind, namespace, name)
		if err != nil {
			p, err := PendingGet(id, err)
			return false, p, err
		}
		return RolloutStatus(obj)
	})
}

// GetWorkload reads the Deployment, DaemonSet or StatefulSet (kind, in any case) namespace/name.
func GetWorkload(ctx context.Context, c *Clients, kind, namespace, name string) (runtime.Object, error) {
	get, err := workloadGetter(c, kind, namespace)
	if err != nil {
		return nil, err
	}
	return get(ctx, name)
}

func workloadGetter(c *Clients, kind, namespace string) (func(context.Context, string) (runtime.Object, error), error) {
	apps := c.Kube.AppsV1()
	switch strings.ToLower(kind) {
	case "deployment":
		return func(ctx context.Context, name string) (runtime.Object, error) {
			return apps.Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		}, nil
	case "daemonset":
		return func(ctx context.Context, name string) (runtime.Object, error) {
			return apps.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		}, nil
	case "statefulset":
		return func(ctx context.Context, name string) (runtime.Object, error) {
			return apps.StatefulSets(namespace).Get(ctx, name, metav1.GetOptions{})
		}, nil
	}
	return nil, fmt.Errorf("only a Deployment, DaemonSet or StatefulSet rolls out, not a %s", kind)
}

// RolloutStatus reports whether a Deployment, DaemonSet or StatefulSet (obj, as read from the API
// server) has rolled out, by the rules WaitRollout waits with; when it has not, pending says what
// is still rolling out. An error is a rollout that cannot end by waiting (past its progress
// deadline, an update strategy other than RollingUpdate) or an obj of another type.
func RolloutStatus(obj runtime.Object) (done bool, pending string, err error) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return deploymentRollout(o)
	case *appsv1.DaemonSet:
		return daemonSetRollout(o)
	case *appsv1.StatefulSet:
		return statefulSetRollout(o)
	default:
		return false, "", fmt.Errorf("rollout status of %T: only a Deployment, DaemonSet or StatefulSet rolls out", obj)
	}
}

func deploymentRollout(d *appsv1.Deployment) (bool, string, error) {
	id := "Deployment " + d.Namespace + "/" + d.Name
	if d.Generation > d.Status.ObservedGeneration {
		return false, fmt.Sprintf("%s: spec update not yet observed (generation %d, observed %d)", id, d.Generation, d.Status.ObservedGeneration), nil
	}
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentProgressing && cond.Reason == "ProgressDeadlineExceeded" {
			return false, "", fmt.Errorf("%s exceeded its progress deadline: %s", id, cond.Message)
		}
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	summary := fmt.Sprintf("%s has %d of %d %s updated, %d available", id, st.UpdatedReplicas, want, plural(want, "replica"), st.AvailableReplicas)
	switch {
	case st.UpdatedReplicas < want:
		return false, summary, nil
	case st.Replicas > st.UpdatedReplicas:
		old := st.Replicas - st.UpdatedReplicas
		return false, fmt.Sprintf("%s, %d old %s pending termination", summary, old, plural(old, "replica")), nil
	case st.AvailableReplicas < st.UpdatedReplicas:
		return false, summary, nil
	}
	return true, "", nil
}

func daemonSetRollout(ds *appsv1.DaemonSet) (bool, string, error) {
	id := "DaemonSet " + ds.Namespace + "/" + ds.Name
	if t := ds.Spec.UpdateStrategy.Type; t != appsv1.RollingUpdateDaemonSetStrategyType {
		return false, "", fmt.Errorf("%s has update strategy %s: only a RollingUpdate rollout can be waited for", id, t)
	}
	if ds.Generation > ds.Status.ObservedGeneration {
		return false, fmt.Sprintf("%s: spec update not yet observed (generation %d, observed %d)", id, ds.Generation, ds.Status.ObservedGeneration), nil
	}
	st := ds.Status
	summary := fmt.Sprintf("%s has %d of %d %s updated, %d available", id, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, plural(st.DesiredNumberScheduled, "pod"), st.NumberAvailable)
	if st.UpdatedNumberScheduled < st.DesiredNumberScheduled || st.NumberAvailable < st.DesiredNumberScheduled {
		return false, summary, nil
	}
	return true, "", nil
}

func statefulSetRollout(s *appsv1.StatefulSet) (bool, string, error) {
	id := "StatefulSet " + s.Namespace + "/" + s.Name
	if t := s.Spec.UpdateStrategy.Type; t != appsv1.RollingUpdateStatefulSetStrategyType {
		return false, "", fmt.Errorf("%s has update strategy %s: only a RollingUpdate rollout can be waited for", id, t)
	}
	if s.Status.ObservedGeneration == 0 || s.Generation > s.Status.ObservedGeneration {
		return false, fmt.Sprintf("%s: spec update not yet observed (generation %d, observed %d)", id, s.Generation, s.Status.ObservedGeneration), nil
	}
	want := int32(1)
	if s.Spec.Replicas != nil {
		want = *s.Spec.Replicas
	}
	st := s.Status
	if st.ReadyReplicas < want {
		return false, fmt.Sprintf("%s has %d of %d %s ready, %d updated", id, st.ReadyReplicas, want, plural(want, "replica"), st.UpdatedReplicas), nil
	}
	if ru := s.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil && *ru.Partition > 0 {
		target := want - *ru.Partition
		if st.UpdatedReplicas < target {
			return false, fmt.Sprintf("%s has %d of %d %s updated (partition %d)", id, st.UpdatedReplicas, target, plural(target, "replica"), *ru.Partition), nil
		}
		return true, "", nil
	}
	if st.UpdateRevision != st.CurrentRevision {
		return false, fmt.Sprintf("%s has %d of %d %s updated to revision %s", id, st.UpdatedReplicas, want, plural(want, "replica"), st.UpdateRevision), nil
	}
	return true, "", nil
}

func plural(n int32, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// WaitNodesReady waits until every named Node exists and reports Ready.
func WaitNodesReady(ctx context.Context, c *Clients, names []string, timeout time.Duration) error {
	if len(names) == 0 {
		return nil
	}
	return Poll(ctx, timeout, "nodes to be Ready", func(ctx context.Context) (bool, string, error) {
		list, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			if !retryable(err) {
				return false, "", fmt.Errorf("list nodes: %w", err)
			}
			return false, fmt.Sprintf("list nodes: %v", err), nil
		}
		byName := make(map[string]*corev1.Node, len(list.Items))
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		var pending []string
		for _, name := range names {
			n, ok := byName[name]
			if !ok {
				pending = append(pending, "node "+name+" not found")
				continue
			}
			if p := nodeNotReady(n); p != "" {
				pending = append(pending, p)
			}
		}
		sort.Strings(pending)
		return len(pending) == 0, strings.Join(pending, ", "), nil
	})
}

// nodeNotReady describes why a Node is not Ready, or returns "" when it is.
func nodeNotReady(n *corev1.Node) string {
	for _, cond := range n.Status.Conditions {
		if cond.Type != corev1.NodeReady {
			continue
		}
		if cond.Status == corev1.ConditionTrue {
			return ""
		}
		state := "not Ready"
		if cond.Status == corev1.ConditionUnknown {
			state = "Ready unknown"
		}
		reason := strings.TrimSpace(ConditionText(cond.Reason, cond.Message))
		if reason == "" {
			return "node " + n.Name + " " + state
		}
		return fmt.Sprintf("node %s %s (%s)", n.Name, state, reason)
	}
	return "node " + n.Name + " has not reported Ready yet"
}

// ConditionText says why a condition is as it is: "Reason: message", either part left out when
// empty.
func ConditionText(reason, message string) string {
	return strings.Join(slices.DeleteFunc([]string{reason, message}, func(s string) bool { return s == "" }), ": ")
}

// WaitReady polls the API server's /readyz until it answers ok, for at most timeout: after k3s
// started or restarted. apiHost names the API in errors.
func WaitReady(ctx context.Context, c *Clients, apiHost string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 10*time.Second)
		body, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(reqCtx)
		reqCancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		if dnsErr := (*net.DNSError)(nil); errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			// A name that does not exist will not exist in five minutes either.
			return fmt.Errorf("the API at %s cannot be reached: %w", apiHost, err)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("the API at %s did not answer ready within %s: %w", apiHost, timeout.Round(time.Second), last)
		case <-time.After(time.Second):
		}
	}
}
