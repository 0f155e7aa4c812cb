package app

import (
	"testing"

	"k8s.io/utils/ptr"
)

// TestInvalid holds each rule of an invalid autoscaling block, with the words the upgrade's check
// prints after "its autoscaling settings are invalid: ", and blocks that meet the rules.
func TestInvalid(t *testing.T) {
	i := ptr.To[int32]
	for _, tc := range []struct {
		name string
		a    Autoscale
		want string
	}{
		{"min above max", Autoscale{Min: i(6), Max: i(5)}, "its minimum 6 is above its maximum 5"},
		{"min below 1", Autoscale{Min: i(0), Max: i(5)}, "its minimum 0 is below 1"},
		{"max below 1", Autoscale{Max: i(0)}, "its maximum 0 is below 1"},
		{"min above 1 without max", Autoscale{Min: i(2)}, "its minimum 2 is above 1 without a maximum"},
		{"on without max", Autoscale{Enabled: true, CPUTarget: i(70)}, "autoscaling is on without a maximum"},
		{"on with a negative target", Autoscale{Enabled: true, Max: i(3), CPUTarget: i(70), MemoryTarget: i(-1)}, "autoscaling is on with a negative target"},
		{"on without target", Autoscale{Enabled: true, Max: i(3), CPUTarget: i(0)}, "autoscaling is on without a target"},
		{"off with a negative target", Autoscale{Max: i(3), CPUTarget: i(-5)}, ""},
		{"off without anything", Autoscale{}, ""},
		{"off with min 1 only", Autoscale{Min: i(1)}, ""},
		{"on", Autoscale{Enabled: true, Min: i(2), Max: i(5), MemoryTarget: i(80)}, ""},
	} {
		if got := tc.a.Invalid(); got != tc.want {
			t.Errorf("%s: Invalid() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestBounds: the minimum defaults to 1, the maximum to none; a count outside moves to the
// nearest bound; an app starts at its minimum when autoscaling is on.
func TestBounds(t *testing.T) {
	i := ptr.To[int32]
	unbounded := Autoscale{}.Bounds()
	if unbounded.String() != "1 or more" || unbounded.Holds(0) || !unbounded.Holds(1000) || unbounded.Choice() != "with N of 1 or more" {
		t.Errorf("unset bounds: %s, %s", unbounded, unbounded.Choice())
	}
	b := Autoscale{Min: i(2), Max: i(5)}.Bounds()
	if b.String() != "2 to 5" || b.Choice() != "with N from 2 to 5" || b.Holds(1) || !b.Holds(2) || !b.Holds(5) || b.Holds(6) {
		t.Errorf("2 to 5: %s, %s", b, b.Choice())
	}
	for n, want := range map[int32]int32{0: 2, 1: 2, 3: 3, 5: 5, 9: 5} {
		if got := b.Clamp(n); got != want {
			t.Errorf("Clamp(%d) = %d, want %d", n, got, want)
		}
	}
	on := Autoscale{Enabled: true, Min: i(2), Max: i(5), CPUTarget: i(70)}
	if StartCount(4, on) != 2 || StartCount(4, Autoscale{Min: i(2), Max: i(5)}) != 4 {
		t.Errorf("StartCount: %d on, %d off", StartCount(4, on), StartCount(4, Autoscale{Min: i(2), Max: i(5)}))
	}
	if got := on.Describe(); got != "on, bounds 2 to 5, CPU target 70%" {
		t.Errorf("Describe() = %q", got)
	}
}
