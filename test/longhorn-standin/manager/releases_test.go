package manager

import (
	"regexp"
	"strings"
	"testing"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPerEngine(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"false", `{"v1":"false","v2":"false"}`},
		{"8", `{"v1":"8","v2":"8"}`},
		{`{"v1":"false","v2":"true"}`, `{"v1":"false","v2":"true"}`},
	} {
		if got := PerEngine(c.value); got != c.want {
			t.Errorf("PerEngine(%q) = %q, want %q", c.value, got, c.want)
		}
	}
	cpu, _ := FindSetting(SettingManagerCPU)
	checker, _ := FindSetting(settingUpgradeChecker)
	r19, r110 := must(t, "v1.9.2"), must(t, "v1.10.2")
	if got := r19.Value(cpu, "12"); got != "12" {
		t.Errorf("1.9's guaranteed-instance-manager-cpu: %q, want the plain value", got)
	}
	if got := r110.Value(cpu, "12"); got != `{"v1":"12","v2":"12"}` {
		t.Errorf("1.10's guaranteed-instance-manager-cpu: %q, want JSON per engine", got)
	}
	if got := r110.Value(checker, "false"); got != "false" {
		t.Errorf("1.10's upgrade-checker: %q", got)
	}
	if f, err := r110.v1Float(`{"v1":"12.5","v2":"20"}`); err != nil || f != 12.5 {
		t.Errorf("1.10's v1 share: %v, %v", f, err)
	}
	if f, err := r19.v1Float("7.5"); err != nil || f != 7.5 {
		t.Errorf("1.9's share: %v, %v", f, err)
	}
}

func must(t *testing.T, v string) Release {
	t.Helper()
	r, err := Find(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCheckUpgradePath: Longhorn's refusals, with its messages (LM upgrade/util/util.go).
func TestCheckUpgradePath(t *testing.T) {
	old := lh.EngineImage{ObjectMeta: metav1.ObjectMeta{Name: "ei-0ld"}, Status: lh.EngineImageStatus{RefCount: 2,
		EngineVersionDetails: lh.EngineVersionDetails{CLIAPIVersion: 6, ControllerAPIVersion: 3}}}
	unused := old
	unused.Status.RefCount = 0
	for _, c := range []struct {
		current, next string
		images        []lh.EngineImage
		want          string
	}{
		{"", "v1.7.3", nil, ""},
		{"v1.7.3", "v1.7.3", nil, ""},
		{"v1.7.3", "v1.8.2", nil, ""},
		{"v1.10.0", "v1.10.2", nil, ""},
		{"v1.7.3", "v1.9.2", nil, "failed to upgrade since upgrading from v1.7.3 to v1.9.2 for minor version is not supported"},
		{"v1.9.2", "v1.8.2", nil, "failed to upgrade since downgrading from v1.9.2 to v1.8.2 is not supported"},
		{"v1.10.3", "v1.10.2", nil, "failed to upgrade since downgrading from v1.10.3 to v1.10.2 is not supported"},
		{"v1.7.3", "v1.8.2", []lh.EngineImage{unused}, ""},
		{"v1.7.3", "v1.8.2", []lh.EngineImage{old}, "failed checking Engine upgrade path: incompatible Engine ei-0ld controller API version: found version 3 is below required minimal version 4"},
	} {
		err := CheckUpgradePath(c.current, must(t, c.next), c.images)
		if got := ""; err != nil {
			got = err.Error()
			if got != c.want {
				t.Errorf("%q → %s: %q, want %q", c.current, c.next, got, c.want)
			}
		} else if c.want != "" {
			t.Errorf("%q → %s: accepted, want %q", c.current, c.next, c.want)
		}
	}
}

// TestNames: Longhorn's name forms (LM types/types.go): ei-, imi- and 8 hex digits, an instance
// manager's 32; each follows its input.
func TestNames(t *testing.T) {
	r := must(t, "v1.8.2")
	if n := EngineImageName(r.EngineImage()); !regexp.MustCompile(`^ei-[0-9a-f]{8}$`).MatchString(n) || n == EngineImageName(must(t, "v1.9.2").EngineImage()) ||
		n != EngineImageName(" "+r.EngineImage()+" ") {
		t.Errorf("engine image name %q", n)
	}
	if n := InstanceManagerName("lab1", r.InstanceManagerImage()); !regexp.MustCompile(`^instance-manager-[0-9a-f]{32}$`).MatchString(n) || n == InstanceManagerName("lab2", r.InstanceManagerImage()) {
		t.Errorf("instance manager name %q", n)
	}
	if l := InstanceManagerImageLabel(r.InstanceManagerImage()); !strings.HasPrefix(l, "imi-") || len(l) != 12 {
		t.Errorf("instance manager image label %q", l)
	}
}
