package upgrade

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
)

// TestCheckApp holds every row of spec 002's repair table, each kind of app that needs a
// decision, the autoscaled app at 0 and apps that meet the rules, with the spec's example
// wording for the first two.
func TestCheckApp(t *testing.T) {
	app := func(name string, mutate func(a *App)) *App {
		a := &App{Project: "shop", Environment: "prod", Name: name, Stored: 3, Min: ptr.To[int32](2), Max: ptr.To[int32](5),
			CPUTarget: ptr.To[int32](70), Desired: ptr.To[int32](3)}
		mutate(a)
		return a
	}
	for _, tc := range []struct {
		app     *App
		kind    Kind
		why     string // a prefix of Finding.Why
		changes []string
		advice  string
		fix     *Fix
	}{
		// The spec's examples.
		{app: app("api", func(a *App) { a.Enabled, a.Stored = true, 1 }), kind: Repair,
			why:     "autoscaling is on and it stores replicas 1, outside its bounds of 2 to 5, so the stored count becomes the running count when the fix is written.",
			changes: []string{"replicas: 1 → 3 (the running count when the fix is written)"}, fix: &Fix{FromDeployment: true}},
		{app: app("worker", func(a *App) { a.Desired = ptr.To[int32](4) }), kind: Decision,
			why:    "autoscaling is off, but its Deployment is set to 4 while it stores 3. Any reconcile restores 3.",
			advice: "Set the count you want with 'kip app scale worker --project shop --environment prod --replicas N', with N from 2 to 5."},

		// The repairs.
		{app: app("stopped-on", func(a *App) { a.Enabled, a.Stopped, a.Stored, a.Desired = true, true, 9, ptr.To[int32](0) }), kind: Repair,
			why: "it is stopped and stores replicas 9, outside its bounds of 2 to 5, so the stored count moves into them", changes: []string{"replicas: 9 → 5"}, fix: &Fix{Replicas: ptr.To[int32](5)}},
		{app: app("stopped-off", func(a *App) { a.Stopped, a.Stored, a.Desired = true, 1, ptr.To[int32](0) }), kind: Repair,
			why: "it is stopped with autoscaling off and stores replicas 1, outside its bounds of 2 to 5, so the bounds widen", changes: []string{"minReplicas: 2 → 1"}, fix: &Fix{Min: ptr.To[int32](1)}},
		{app: app("zero", func(a *App) { a.Stored, a.Desired = 0, ptr.To[int32](0) }), kind: Repair,
			why:     "autoscaling is off and both its Deployment and its stored count are 0, so a stop is recorded",
			changes: []string{`stop: none → "scaled to 0 before Kipper v0.24.0"`, "replicas: 0 → 2"}, fix: &Fix{Replicas: ptr.To[int32](2), StopReason: "scaled to 0 before Kipper v0.24.0"}},
		{app: app("wide", func(a *App) { a.Stored, a.Desired = 8, ptr.To[int32](8) }), kind: Repair,
			why: "autoscaling is off and its Deployment and stored count are both 8, outside its bounds of 2 to 5, so the bounds widen", changes: []string{"maxReplicas: 5 → 8"}, fix: &Fix{Max: ptr.To[int32](8)}},

		// The decisions.
		{app: app("unread", func(a *App) { a.Desired, a.DeploymentErr = nil, errors.New("forbidden") }), kind: Decision,
			why: "its Deployment cannot be read (forbidden).", advice: "Once it can, run kip upgrade --check again"},
		{app: app("gone", func(a *App) { a.Desired, a.Missing = nil, true }), kind: Decision, why: "its Deployment is missing while the app is not stopped."},
		{app: app("min-above-max", func(a *App) { a.Min = ptr.To[int32](6) }), kind: Decision, why: "its autoscaling settings are invalid: its minimum 6 is above its maximum 5."},
		{app: app("min-zero", func(a *App) { a.Min = ptr.To[int32](0) }), kind: Decision, why: "its autoscaling settings are invalid: its minimum 0 is below 1."},
		{app: app("max-zero", func(a *App) { a.Min, a.Max = nil, ptr.To[int32](0) }), kind: Decision, why: "its autoscaling settings are invalid: its maximum 0 is below 1."},
		{app: app("min-no-max", func(a *App) { a.Max = nil }), kind: Decision, why: "its autoscaling settings are invalid: its minimum 2 is above 1 without a maximum."},
		{app: app("on-no-max", func(a *App) { a.Enabled, a.Min, a.Max = true, nil, nil }), kind: Decision, why: "its autoscaling settings are invalid: autoscaling is on without a maximum."},
		{app: app("on-no-target", func(a *App) { a.Enabled, a.CPUTarget = true, nil }), kind: Decision, why: "its autoscaling settings are invalid: autoscaling is on without a target."},
		{app: app("on-negative", func(a *App) { a.Enabled, a.MemoryTarget = true, ptr.To[int32](-1) }), kind: Decision, why: "its autoscaling settings are invalid: autoscaling is on with a negative target."},
		{app: app("stale-hpa", func(a *App) { a.Enabled, a.Desired = true, ptr.To[int32](9) }), kind: Decision,
			why: "autoscaling is on, but its Deployment is set to 9, outside its bounds of 2 to 5. Check whether a stale autoscaler or another writer is changing it."},
		{app: app("no-fix", func(a *App) { a.Stopped, a.Stored, a.Desired = true, 0, ptr.To[int32](0) }), kind: Decision,
			why: "it is stopped with autoscaling off and stores replicas 0, and no bounds may include 0", advice: "Set the count it starts at with 'kip app scale no-fix --project shop --environment prod --replicas N', with N from 2 to 5."},

		// Autoscaled at 0 without a stop: listed, started by the new console-api.
		{app: app("idle", func(a *App) { a.Enabled, a.Desired = true, ptr.To[int32](0) }), kind: StartsAtZero,
			why: "autoscaling is on and its Deployment is set to 0 without a stop, so the new console-api starts it at its minimum, 2. To keep it at 0, stop it first with 'kip app stop idle --project shop --environment prod'."},

		// Within the rules.
		{app: app("fine-off", func(*App) {})},
		{app: app("fine-on", func(a *App) { a.Enabled = true })},
		{app: app("fine-stopped", func(a *App) { a.Stopped, a.Desired = true, ptr.To[int32](0) })},
		{app: app("fine-unbounded", func(a *App) { a.Min, a.Max, a.Stored, a.Desired = nil, nil, 7, ptr.To[int32](7) })},
		{app: app("stopped-gone", func(a *App) { a.Stopped, a.Desired, a.Missing = true, nil, true })},
	} {
		f := CheckApp(tc.app, "v0.24.0")
		if tc.kind == 0 {
			if f != nil {
				t.Errorf("%s: %+v, want no finding", tc.app, f)
			}
			continue
		}
		if f == nil {
			t.Errorf("%s: no finding, want kind %d", tc.app, tc.kind)
			continue
		}
		if f.Kind != tc.kind || !strings.HasPrefix(f.Why, tc.why) || !strings.HasPrefix(f.Advice, tc.advice) ||
			tc.changes != nil && !reflect.DeepEqual(f.Changes, tc.changes) || !reflect.DeepEqual(f.Fix, tc.fix) {
			t.Errorf("%s: kind %d, why %q, changes %q, advice %q, fix %+v\nwant kind %d, why %q…, changes %q, advice %q…, fix %+v",
				tc.app, f.Kind, f.Why, f.Changes, f.Advice, f.Fix, tc.kind, tc.why, tc.changes, tc.advice, tc.fix)
		}
		if f.Kind == Decision && !strings.Contains(f.Advice, "'kip app ") && !strings.Contains(f.Advice, "kip upgrade --check") {
			t.Errorf("%s: the decision's advice names no command: %q", tc.app, f.Advice)
		}
	}
}
