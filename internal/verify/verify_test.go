package verify

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestVerifyJobNames: nodes whose long names share their first 50 characters got the same
// verification Job (the name was cut at 63 characters), so one node's check passed for both.
func TestVerifyJobNames(t *testing.T) {
	long := strings.Repeat("worker-in-the-frankfurt-datacenter-", 2)
	a, b := JobName("ab12c", long+"a"), JobName("ab12c", long+"b")
	if a == b {
		t.Fatalf("two nodes share the verification Job %s", a)
	}
	for _, name := range []string{a, b, JobName("ab12c", "srv1"), JobName("ab12c", "node-"+strings.Repeat("x", 60)+"-.y")} {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("%s: %v", name, errs)
		}
	}
	if got := JobName("ab12c", "srv1"); !strings.HasPrefix(got, "kip-verify-ab12c-srv1-") {
		t.Errorf("short name: %s", got)
	}
}
