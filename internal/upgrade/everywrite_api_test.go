//go:build kipfault

package upgrade

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/fault/faulttest"
)

// helperKubeconfig, set, makes the test binary the helper process that runs kip upgrade
// --skip-system --repair-autoscaling off a terminal against the parent's API server.
const helperKubeconfig = "KIP_UPGRADE_HELPER_KUBECONFIG"

func init() { asHelper = faulttest.AsHelper(helperKubeconfig, helperUpgrade) }

func helperUpgrade(kubeconfig string) error {
	cl, err := faulttest.Clients(kubeconfig)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	o := quietOptions(cl, &out)
	o.SkipSystem, o.RepairAutoscaling = true, true
	err = Run(context.Background(), o)
	os.Stderr.Write(out.Bytes())
	return err
}

// TestUpgradeKilledAfterEveryWrite kills kip upgrade --skip-system --repair-autoscaling right
// after each of its writes in turn (the CRDs, console-api's RBAC and admission policies, each
// console Deployment's restart, the autoscaling fix), each run resuming what the one before
// left, and checks that the end state is the uninterrupted upgrade's (TestUpgradeConsoleLayer's
// checkUpgraded): the CRD marker, console-api hardened with the hand-added volume kept, both
// Deployments restarted once by the same upgrade and serving alone on their new pods, the fix
// written, the record finished.
func TestUpgradeKilledAfterEveryWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, cl := installed(ctx, t, "upgrade-every-write-node")
	operatorEdits(ctx, t, cl)
	ns := projectNamespace(t, cl, "every", "prod")
	bounds := map[string]any{"enabled": true, "minReplicas": int64(2), "maxReplicas": int64(5), "cpuTarget": int64(70)}
	addApp(t, cl, ns, "api", map[string]any{"replicas": int64(1), "autoscale": bounds}, 3)

	made := filepath.Join(t.TempDir(), "made")
	before := template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation] // an earlier test's, or none
	marks := map[string]bool{}
	writes := faulttest.KillEveryWrite(t, "kip upgrade --skip-system --repair-autoscaling", func() (syscall.Signal, string) {
		r := faulttest.Run(t, 5*time.Minute, helperKubeconfig+"="+env.KubeconfigPath, fault.KillNewWriteEnv+"="+made)
		if r.Signal == 0 && r.Exit != 0 {
			t.Fatalf("the upgrade failed:\n%s", r.Stderr)
		}
		return r.Signal, r.Stderr
	}, func(write string) {
		// Whatever the run was killed after, a resumed upgrade restarts the console with the
		// mark the first run chose, never with one of its own.
		marks[template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation]] = true
	})
	t.Logf("writes killed after:\n%s", strings.Join(writes, "\n"))
	var sawFix, sawRestart bool
	for _, w := range writes {
		sawFix = sawFix || strings.Contains(w, "/apis/kipper.run/v1alpha1/namespaces/"+ns+"/apps/api")
		sawRestart = sawRestart || strings.Contains(w, "/namespaces/kipper-system/deployments/console-api")
	}
	if !sawFix || !sawRestart {
		t.Errorf("no kill after the fix (%v) or console-api's restart (%v) among the writes", sawFix, sawRestart)
	}
	checkUpgraded(ctx, t, cl, ns)
	// Until the upgrade wrote its mark the template kept the one before; after, only the
	// upgrade's: no resumed run restarted the console with a mark of its own.
	mark := template(ctx, t, cl, "console-api").Annotations[upgradedAtAnnotation]
	for m := range marks {
		if m != mark && m != before {
			t.Errorf("console-api was restarted with mark %q besides the upgrade's %q", m, mark)
		}
	}
}
