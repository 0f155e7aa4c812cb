package service_test

import (
	"testing"

	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/service"
)

// TestFencedStart checks the fence's one rule for whether a service may start without the fenced
// worker, and the words each command gives when it may not.
func TestFencedStart(t *testing.T) {
	s := &service.Service{Ref: service.Ref{Project: "co", Environment: "prod", Name: "db"}}
	tests := []struct {
		verdict            string
		accepted, starts   bool
		fenceWhy, startWhy string
	}{
		{verdict: longhorn.DataCurrent, starts: true},
		{verdict: longhorn.DataCurrent, accepted: true, starts: true},
		{verdict: longhorn.DataStale, accepted: true, starts: true},
		{verdict: longhorn.DataStale,
			fenceWhy: "no node but w1 holds a copy of its data known to be current, and older data was not accepted",
			startWhy: "no node holds a copy of its data known to be current: to start it on copies that may be older, " +
				"run kip service start db --project co --environment prod --accept-stale-data (kip service info shows where its data is)"},
		{verdict: longhorn.DataOnlyThere, accepted: true,
			fenceWhy: "its only copy of some volume is on w1",
			startWhy: service.OnlyThereRecipe(s, "w1", "192.0.2.51")},
	}
	for _, tt := range tests {
		d := service.FencedStart{Verdict: tt.verdict, Accepted: tt.accepted}
		if got := d.Starts(); got != tt.starts {
			t.Errorf("%s, accepted %v: starts %v, want %v", tt.verdict, tt.accepted, got, tt.starts)
		}
		if got := d.FenceWhy("w1"); got != tt.fenceWhy {
			t.Errorf("%s, accepted %v: the fence's why\n%q, want\n%q", tt.verdict, tt.accepted, got, tt.fenceWhy)
		}
		if got := d.StartWhy(s, "w1", "192.0.2.51"); got != tt.startWhy {
			t.Errorf("%s, accepted %v: the start's why\n%q, want\n%q", tt.verdict, tt.accepted, got, tt.startWhy)
		}
	}
}
