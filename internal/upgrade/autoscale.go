// Package upgrade is kip upgrade (spec 002, "Upgrades & Maintenance"). This file holds the
// autoscaling rules its check applies to each App: which stored settings the new console-api
// refuses, the four repairs kip upgrade writes on consent, and the five kinds of app that need
// the operator's decision.
package upgrade

import (
	"fmt"
	"math"
	"strconv"

	"kipper.run/kip/internal/app"
)

// App is what the autoscaling check reads of one Kipper App and its Deployment.
type App struct {
	Project, Environment, Name string
	// Stored is the App's stored replica count (spec.replicas).
	Stored int32
	// Autoscale is spec.autoscale: Enabled, and its bounds and targets where set.
	Enabled                 bool
	Min, Max                *int32
	CPUTarget, MemoryTarget *int32
	// Stopped: spec.stop is present.
	Stopped bool
	// Desired is the Deployment's desired count (spec.replicas), nil when it has none;
	// DeploymentErr says why the Deployment could not be read; Missing that it does not exist.
	Desired       *int32
	Missing       bool
	DeploymentErr error
	// Credential is the shared git credential the app's builds use (spec.git.credential), "" for
	// none.
	Credential string
}

// Namespace is the App's namespace: its project's environment.
func (a *App) Namespace() string { return a.Project + "-" + a.Environment }

func (a *App) String() string { return a.Namespace() + "/" + a.Name }

// flags name the App on a kip app command line.
func (a *App) flags() string {
	return a.Name + " --project " + a.Project + " --environment " + a.Environment
}

// Kind is what the check found about an App.
type Kind int

const (
	// Repair: the new rules refuse the App's settings, and kip upgrade fixes them on consent.
	Repair Kind = iota + 1
	// Decision: the App needs the operator's decision; kip upgrade changes nothing of it.
	Decision
	// StartsAtZero: autoscaled, its Deployment set to 0 without a stop; the new console-api
	// starts it at its minimum.
	StartsAtZero
)

// Fix is the single App update a repair writes.
type Fix struct {
	// Replicas is the new stored count; FromDeployment takes the Deployment's desired count at
	// the time the fix is written instead (within the bounds, or the fix is not written).
	Replicas       *int32
	FromDeployment bool
	// Min and Max are the new bounds, where they change.
	Min, Max *int32
	// StopReason records a stop with this reason.
	StopReason string
}

// Finding is one App's verdict.
type Finding struct {
	App  *App
	Kind Kind
	// Why says what the check found, after "- namespace/app: ".
	Why string
	// Changes are a repair's values before and after, one per line ("replicas: 1 → 3 (…)").
	Changes []string
	// Advice is a decision's next step, naming the command to run.
	Advice string
	Fix    *Fix
}

// bounds are an App's autoscaling bounds: its minimum (1 when unset) and maximum (none when
// unset).
type bounds struct{ lo, hi int64 }

func (b bounds) holds(n int32) bool { return int64(n) >= b.lo && int64(n) <= b.hi }

func (b bounds) String() string {
	if b.hi == math.MaxInt64 {
		return fmt.Sprintf("%d or more", b.lo)
	}
	return fmt.Sprintf("%d to %d", b.lo, b.hi)
}

// choice is the range of counts to choose from, for a decision's advice.
func (b bounds) choice() string {
	if b.hi == math.MaxInt64 {
		return fmt.Sprintf("with N of %d or more", b.lo)
	}
	return fmt.Sprintf("with N from %d to %d", b.lo, b.hi)
}

func (a *App) bounds() bounds {
	b := bounds{lo: 1, hi: math.MaxInt64}
	if a.Min != nil {
		b.lo = int64(*a.Min)
	}
	if a.Max != nil {
		b.hi = int64(*a.Max)
	}
	return b
}

// invalid says how the App's autoscaling block breaks the rules, "" when it does not: the rule
// kip app autoscale applies too (app.Autoscale.Invalid).
func (a *App) invalid() string {
	return app.Autoscale{Enabled: a.Enabled, Min: a.Min, Max: a.Max, CPUTarget: a.CPUTarget, MemoryTarget: a.MemoryTarget}.Invalid()
}

// CheckApp applies the rules of the kip at kipVersion to a: nil when a meets them.
func CheckApp(a *App, kipVersion string) *Finding {
	decide := func(why, advice string) *Finding {
		return &Finding{App: a, Kind: Decision, Why: why + ".", Advice: advice}
	}
	scale := "'kip app scale " + a.flags() + " --replicas N'"
	switch {
	case a.DeploymentErr != nil:
		return decide("its Deployment cannot be read ("+a.DeploymentErr.Error()+")",
			"Once it can, run kip upgrade --check again; 'kip app info "+a.flags()+"' shows the app and its Deployment.")
	case a.Missing && !a.Stopped:
		return decide("its Deployment is missing while the app is not stopped",
			"See the app with 'kip app info "+a.flags()+"', then restart it with 'kip app restart "+a.flags()+"' or stop it with 'kip app stop "+a.flags()+"'.")
	}
	if why := a.invalid(); why != "" {
		return decide("its autoscaling settings are invalid: "+why,
			"Set valid bounds and a target with 'kip app autoscale "+a.flags()+"', or turn autoscaling off with 'kip app autoscale "+a.flags()+" --off'.")
	}
	b := a.bounds()
	stored := strconv.Itoa(int(a.Stored))
	if a.Stopped {
		switch {
		case b.holds(a.Stored):
			return nil
		case a.Enabled:
			to := clamp(a.Stored, b)
			return &Finding{App: a, Kind: Repair,
				Why:     fmt.Sprintf("it is stopped and stores replicas %d, outside its bounds of %s, so the stored count moves into them (a start uses the minimum anyway).", a.Stored, b),
				Changes: []string{fmt.Sprintf("replicas: %d → %d", a.Stored, to)},
				Fix:     &Fix{Replicas: &to}}
		case a.Stored == 0:
			return decide(fmt.Sprintf("it is stopped with autoscaling off and stores replicas 0, and no bounds may include 0 (its bounds are %s), so no fix satisfies the rules", b),
				"Set the count it starts at with "+scale+", "+b.choice()+".")
		}
		return widen(a, b, fmt.Sprintf("it is stopped with autoscaling off and stores replicas %d, outside its bounds of %s, so the bounds widen to include the count it starts at.", a.Stored, b))
	}
	if a.Desired == nil {
		return decide("its Deployment sets no replica count", "See the app with 'kip app info "+a.flags()+"'.")
	}
	d := *a.Desired
	if a.Enabled {
		switch {
		case d == 0:
			return &Finding{App: a, Kind: StartsAtZero,
				Why: fmt.Sprintf("autoscaling is on and its Deployment is set to 0 without a stop, so the new console-api starts it at its minimum, %d. To keep it at 0, stop it first with 'kip app stop %s'.", b.lo, a.flags())}
		case !b.holds(d):
			return decide(fmt.Sprintf("autoscaling is on, but its Deployment is set to %d, outside its bounds of %s. Check whether a stale autoscaler or another writer is changing it", d, b),
				"Set the count you want with "+scale+", "+b.choice()+".")
		case !b.holds(a.Stored):
			return &Finding{App: a, Kind: Repair,
				Why:     fmt.Sprintf("autoscaling is on and it stores replicas %d, outside its bounds of %s, so the stored count becomes the running count when the fix is written.", a.Stored, b),
				Changes: []string{fmt.Sprintf("replicas: %d → %d (the running count when the fix is written)", a.Stored, d)},
				Fix:     &Fix{FromDeployment: true}}
		}
		return nil
	}
	switch {
	case d != a.Stored:
		return decide(fmt.Sprintf("autoscaling is off, but its Deployment is set to %d while it stores %d. Any reconcile restores %d", d, a.Stored, a.Stored),
			"Set the count you want with "+scale+", "+b.choice()+".")
	case d == 0:
		reason := "scaled to 0 before Kipper " + kipVersion
		lo := int32(b.lo)
		return &Finding{App: a, Kind: Repair,
			Why:     "autoscaling is off and both its Deployment and its stored count are 0, so a stop is recorded and the stored count becomes its minimum: it stays at 0, its route serves the stopped page, and 'kip app start " + a.flags() + "' starts it at " + strconv.Itoa(int(lo)) + ".",
			Changes: []string{"stop: none → \"" + reason + "\"", "replicas: 0 → " + strconv.Itoa(int(lo))},
			Fix:     &Fix{Replicas: &lo, StopReason: reason}}
	case !b.holds(d):
		return widen(a, b, fmt.Sprintf("autoscaling is off and its Deployment and stored count are both %s, outside its bounds of %s, so the bounds widen to include the count, because moving the count into them would scale the app.", stored, b))
	}
	return nil
}

// widen is the repair that widens a's bounds to include its stored count.
func widen(a *App, b bounds, why string) *Finding {
	f := &Finding{App: a, Kind: Repair, Why: why, Fix: &Fix{}}
	n := a.Stored
	if int64(n) < b.lo {
		f.Fix.Min = &n
		f.Changes = append(f.Changes, fmt.Sprintf("minReplicas: %d → %d", b.lo, n))
	} else {
		f.Fix.Max = &n
		f.Changes = append(f.Changes, fmt.Sprintf("maxReplicas: %d → %d", b.hi, n))
	}
	return f
}

func clamp(n int32, b bounds) int32 {
	switch {
	case int64(n) < b.lo:
		return int32(b.lo)
	case int64(n) > b.hi:
		return int32(b.hi)
	}
	return n
}
