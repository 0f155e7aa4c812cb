//go:build kipfault

package components

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"kipper.run/kip/internal/fault/faulttest"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

const (
	// helperKubeconfig, set, makes the test binary the helper process that applies the widgets
	// component with the values helperValues gives against the parent's API server.
	helperKubeconfig = "KIP_COMPONENTS_HELPER_KUBECONFIG"
	helperValues     = "KIP_COMPONENTS_HELPER_VALUES"

	widgetsVersion = "1.2.3"
)

func init() {
	asHelper = faulttest.AsHelper(helperKubeconfig, func(kubeconfig string) error {
		cl, err := faulttest.Clients(kubeconfig)
		if err != nil {
			return err
		}
		return Apply(context.Background(), cl, widgets(os.Getenv(helperValues)))
	})
}

// widgets is a chart component whose HelmChart, kube-system/widgets, installs the widgets chart
// at widgetsVersion with values.
func widgets(values string) Component {
	chart := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
		"metadata": map[string]any{"name": "widgets", "namespace": HelmChartNamespace},
		"spec": map[string]any{
			"chart": "widgets", "repo": "https://charts.example.com", "version": widgetsVersion,
			"valuesContent": values,
		},
	}}
	return Component{Name: "widgets", Version: widgetsVersion, Objects: []*unstructured.Unstructured{chart}}
}

// TestChartChangeKilledAfterItsWrite changes a chart's values at the same version (as the
// upgrade changes Longhorn's settings at the release the cluster runs, or cert-manager's DNS
// resolvers) and kills kip right after its one write, the HelmChart's. helm-controller has not
// replaced the chart's install Job yet: the one it ran for the old values is there, Complete, of
// the same version. The next run must not take it for the new chart's:
//   - the step's check is false, and what is pending names the old Job (no helm-controller runs
//     here, so nothing can replace the Job while the test looks);
//   - the resumed apply is done once helm-controller's Job for the new spec (a new Job, a new
//     UID, as helm-controller replaces it) completes;
//   - an apply that changes nothing keeps the chart's generation and its mark.
func TestChartChangeKilledAfterItsWrite(t *testing.T) {
	env, cl := apiTestClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node := env.AddNode(t, "chart-change-node", testenv.NodeOptions{})
	before, after := widgets("replicas: 1\n"), widgets("replicas: 2\n")
	charts := cl.Dynamic.Resource(HelmCharts).Namespace(HelmChartNamespace)
	jobs := cl.Kube.BatchV1().Jobs(HelmChartNamespace)

	// The chart as an earlier kip installed it, and helm-controller's Job for it, Complete.
	if err := kube.Apply(ctx, cl, before.Objects, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("widgets", widgetsVersion, node.Name))
	waitComponentReady(ctx, t, cl, before)
	old, err := jobs.Get(ctx, installJob("widgets"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chart, err := charts.Get(ctx, "widgets", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	generation := chart.GetGeneration()

	env1 := []string{helperKubeconfig + "=" + env.KubeconfigPath, helperValues + "=replicas: 2\n"}
	r := faulttest.Run(t, 2*time.Minute, append(env1, faulttest.KillAfterMatching("/helmcharts/widgets$"))...)
	if what := faulttest.Killed(t, r, 1); !strings.Contains(what, "PATCH") {
		t.Fatalf("killed after %q, not the HelmChart's apply", what)
	}
	chart, err = charts.Get(ctx, "widgets", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	values, _, _ := unstructured.NestedString(chart.Object, "spec", "valuesContent")
	wantMark := fmt.Sprintf("%s/%d", old.UID, generation)
	if values != "replicas: 2\n" || chart.GetGeneration() != generation+1 || chart.GetAnnotations()[replacedJobAnnotation] != wantMark {
		t.Fatalf("the chart after the killed run: values %q, generation %d (before %d), mark %q (want %q)",
			values, chart.GetGeneration(), generation, chart.GetAnnotations()[replacedJobAnnotation], wantMark)
	}
	// The old Job is all there is, Complete and of the chart's version: the component's status
	// alone (kip status) cannot tell it from the new chart's.
	if ready, pending, err := after.Status(ctx, cl); err != nil || !ready {
		t.Fatalf("the old Job is not Complete: ready %v, %q, %v", ready, pending, err)
	}
	if done, err := Step(cl, after).Check(ctx); err != nil || done {
		t.Fatalf("the step's check after the killed run: done %v, err %v; want not done", done, err)
	}
	wantPending := "HelmChart kube-system/widgets: Job helm-install-widgets is the one from before kip changed the chart; k3s's helm-controller has not replaced it yet"
	if ready, pending, err := after.settled(ctx, cl); err != nil || ready || pending != wantPending {
		t.Fatalf("after the killed run: ready %v, pending %q, err %v; want pending %q", ready, pending, err, wantPending)
	}

	// The next run waits for helm-controller's new Job, and is done once it completes.
	p := faulttest.Start(t, 2*time.Minute, env1...)
	deleteHelmJob(ctx, t, cl, old.Name)
	createHelmJob(ctx, t, cl, fakeHelmInstallJob("widgets", widgetsVersion, node.Name))
	if r := p.Wait(t); r.Signal != 0 || r.Exit != 0 {
		t.Fatalf("the resumed apply: signal %v, exit %d\n%s", r.Signal, r.Exit, r.Stderr)
	}
	if done, err := Step(cl, after).Check(ctx); err != nil || !done {
		t.Fatalf("the step's check after the resumed apply: done %v, err %v", done, err)
	}

	// Nothing to change: the chart keeps its generation and its mark (the apply owns the
	// annotation: without it in what kip applies, the server would drop it).
	if err := Apply(ctx, cl, after); err != nil {
		t.Fatal(err)
	}
	chart, err = charts.Get(ctx, "widgets", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if chart.GetGeneration() != generation+1 || chart.GetAnnotations()[replacedJobAnnotation] != wantMark {
		t.Errorf("after an apply that changes nothing: generation %d (want %d), mark %q (want %q)",
			chart.GetGeneration(), generation+1, chart.GetAnnotations()[replacedJobAnnotation], wantMark)
	}
}
