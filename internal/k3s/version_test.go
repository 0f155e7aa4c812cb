package k3s

import (
	"strings"
	"testing"
)

func TestPlanMove(t *testing.T) {
	const pin = "v1.37.2+k3s1"
	tests := []struct {
		installed string
		kind      MoveKind
		to        string
		err       string
		warn      string
	}{
		{"", Install, pin, "", ""},
		{"v1.37.2+k3s1", Keep, "v1.37.2+k3s1", "", ""},
		{"v1.37.1+k3s1", Upgrade, pin, "", ""},
		{"v1.37.2+k3s0", Upgrade, pin, "", ""},
		{"v1.36.9+k3s2", Upgrade, pin, "", ""},                            // +1 minor
		{"v1.35.4+k3s1", KeepBehind, "v1.35.4+k3s1", "", "through v1.36"}, // +2 minors
		{"v1.30.0+k3s1", KeepBehind, "v1.30.0+k3s1", "", "7 Kubernetes minors behind"},
		{"v1.37.2+k3s2", "", "", "never downgraded", ""},
		{"v1.37.3+k3s1", "", "", "pins v1.37.3+k3s1 or later", ""},
		{"v1.38.0+k3s1", "", "", "newer than v1.37.2+k3s1", ""},
		{"1.37", "", "", "not a k3s release", ""},
	}
	for _, tt := range tests {
		t.Run(tt.installed, func(t *testing.T) {
			m, err := PlanMove(tt.installed, pin)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("PlanMove(%q) = %+v, %v; want error containing %q", tt.installed, m, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Kind != tt.kind || m.To != tt.to || m.From != tt.installed {
				t.Fatalf("PlanMove(%q) = %+v, want kind %s to %s", tt.installed, m, tt.kind, tt.to)
			}
			if (tt.warn == "") != (m.Warning == "") || !strings.Contains(m.Warning, tt.warn) {
				t.Fatalf("warning %q, want one containing %q", m.Warning, tt.warn)
			}
		})
	}
}

func TestPlanMoveRejectsABadPin(t *testing.T) {
	if _, err := PlanMove("", "latest"); err == nil || !strings.Contains(err.Error(), "pinned k3s") {
		t.Fatalf("err = %v", err)
	}
}
