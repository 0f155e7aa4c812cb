package upgrade

import (
	"context"
	"fmt"
	"io"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/app"
	"kipper.run/kip/internal/credential"
	"kipper.run/kip/internal/kube"
)

// ReadApps reads every App of the cluster's project namespaces with its Deployment, in three
// API requests whatever the number of apps: the project namespaces, the Apps and the
// Deployments, each listed once. outside counts the Apps of namespaces no project has, which
// the check cannot name a command for.
func ReadApps(ctx context.Context, cl *kube.Clients) (apps []*App, outside int, err error) {
	listed, outside, err := app.ListInProjects(ctx, cl)
	if err != nil {
		return nil, 0, err
	}
	desired := map[string]*int32{}
	deployments, depErr := cl.Kube.AppsV1().Deployments("").List(ctx, metav1.ListOptions{})
	if depErr == nil {
		for i := range deployments.Items {
			d := &deployments.Items[i]
			desired[d.Namespace+"/"+d.Name] = d.Spec.Replicas
		}
	}
	for _, l := range listed {
		u := l.Object
		a := appOf(u)
		a.Project, a.Environment = l.Project, l.Environment
		if depErr != nil {
			a.DeploymentErr = depErr
		} else if r, ok := desired[u.GetNamespace()+"/"+u.GetName()]; ok {
			a.Desired = r
			if r == nil {
				a.Desired = ptr.To[int32](1) // Kubernetes's default
			}
		} else {
			a.Missing = true
		}
		apps = append(apps, a)
	}
	sort.Slice(apps, func(i, j int) bool { return apps[i].String() < apps[j].String() })
	return apps, outside, nil
}

// appOf reads the fields the check judges from an App.
func appOf(u *unstructured.Unstructured) *App {
	a := &App{Name: u.GetName(), Credential: credential.AppCredential(u)}
	if n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "replicas"); ok {
		a.Stored = int32(n)
	}
	a.Enabled, _, _ = unstructured.NestedBool(u.Object, "spec", "autoscale", "enabled")
	a.Min = optionalInt(u, "minReplicas")
	a.Max = optionalInt(u, "maxReplicas")
	a.CPUTarget = optionalInt(u, "cpuTarget")
	a.MemoryTarget = optionalInt(u, "memoryTarget")
	_, a.Stopped, _ = unstructured.NestedMap(u.Object, "spec", "stop")
	return a
}

func optionalInt(u *unstructured.Unstructured, field string) *int32 {
	n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "autoscale", field)
	if !ok {
		return nil
	}
	v := int32(n)
	return &v
}

// Autoscaling is the check's verdict on every app: the findings by kind, in the apps' order.
type Autoscaling struct {
	Repairs, Decisions, AtZero []*Finding
	// Outside counts the Apps of namespaces no project has, not checked.
	Outside int
}

// CheckApps judges every app by the rules of the kip at kipVersion.
func CheckApps(apps []*App, outside int, kipVersion string) Autoscaling {
	r := Autoscaling{Outside: outside}
	for _, a := range apps {
		f := CheckApp(a, kipVersion)
		switch {
		case f == nil:
		case f.Kind == Repair:
			r.Repairs = append(r.Repairs, f)
		case f.Kind == Decision:
			r.Decisions = append(r.Decisions, f)
		default:
			r.AtZero = append(r.AtZero, f)
		}
	}
	return r
}

// Write prints the verdict as spec 002's check shows it.
func (r Autoscaling) Write(w io.Writer) {
	group := func(mark, head string, fs []*Finding) {
		if len(fs) == 0 {
			return
		}
		fmt.Fprintf(w, "  %s   %s\n", mark, head)
		for _, f := range fs {
			fmt.Fprintf(w, "      - %s: %s\n", f.App, f.Why)
			for _, c := range f.Changes {
				fmt.Fprintf(w, "          %s\n", c)
			}
			if f.Advice != "" {
				fmt.Fprintf(w, "          %s\n", f.Advice)
			}
		}
	}
	group("!", "The new rules refuse these apps' autoscaling settings. Once the new console-api\n      is running, kip upgrade changes them as shown, and nothing running changes:", r.Repairs)
	group("!", "These autoscaled apps are at 0 pods without a stop, and start during the upgrade:", r.AtZero)
	group("✗", "These apps need a decision, and kip upgrade does not change them:", r.Decisions)
	if r.Outside > 0 {
		fmt.Fprintf(w, "  !   %d apps are in namespaces no project has, and were not checked\n", r.Outside)
	}
}
