package upgrade

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// TestLonghornPlan: --check lists the Longhorn steps to the pinned release, or says why there
// are none.
func TestLonghornPlan(t *testing.T) {
	for _, tc := range []struct{ runs, pin, want string }{
		{"v1.7.3", "v1.11.3", "Longhorn stays at v1.7.3, the release the cluster runs; this kip pins v1.11.3, reached one minor at a time with kip upgrade --longhorn: v1.8.2, then v1.9.2, then v1.10.2, then v1.11.3"},
		{"v1.10.2", "v1.11.3", "this kip pins v1.11.3, reached one minor at a time with kip upgrade --longhorn: v1.11.3"},
		{"v1.6.4", "v1.11.3", "Longhorn stays at v1.6.4, the release the cluster runs: the cluster runs Longhorn v1.6.4, older than v1.7.3"},
		{"v1.12.0", "v1.11.3", "Longhorn cannot be downgraded"},
	} {
		if got, _ := longhornPlan(tc.runs, tc.pin); !strings.Contains(got, tc.want) {
			t.Errorf("longhornPlan(%s, %s) = %q, want it to contain %q", tc.runs, tc.pin, got, tc.want)
		}
	}
}

// TestWarnLonghornHosts: every upgrade of a Longhorn cluster warns about each node whose OS
// cannot run Longhorn (Rocky Linux or AlmaLinux 9.7 and later 9.x, EL9 kernels from
// 5.14.0-611), read from what the Node reports to the API server.
func TestWarnLonghornHosts(t *testing.T) {
	env := testenv.Get(t)
	cl, err := kube.NewClients(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := func(name, image, kernel string) {
		t.Helper()
		if _, err := cl.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		// A merge patch: the node lifecycle controller changes the Node meanwhile.
		patch := `{"status":{"nodeInfo":{"osImage":"` + image + `","kernelVersion":"` + kernel + `"}}}`
		if _, err := cl.Kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	node("el-rocky97", "Rocky Linux 9.7 (Blue Onyx)", "5.14.0-611.5.1.el9_7.x86_64")
	node("el-alma96", "AlmaLinux 9.6 (Sage Margay)", "5.14.0-570.12.1.el9_6.x86_64")
	node("el-debian", "Debian GNU/Linux 13 (trixie)", "6.12.48+deb13-amd64")
	var out bytes.Buffer
	if err := warnLonghornHosts(ctx, &out, cl); err != nil {
		t.Fatal(err)
	}
	if want := "Node el-rocky97 (Rocky Linux 9.7 (Blue Onyx), kernel 5.14.0-611.5.1.el9_7.x86_64): Rocky Linux 9.7 cannot run Longhorn"; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "Longhorn issue 13606") || !strings.Contains(out.String(), host.LonghornOSFix) {
		t.Errorf("no warning %q with the issue and the fix:\n%s", want, &out)
	}
	for _, ok := range []string{"el-alma96", "el-debian"} {
		if strings.Contains(out.String(), ok) {
			t.Errorf("a warning about %s:\n%s", ok, &out)
		}
	}
}
