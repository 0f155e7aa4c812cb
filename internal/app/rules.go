package app

import (
	"fmt"
	"math"
)

// Autoscale is an App's spec.autoscale: Enabled, and its bounds and targets where set (nil when
// unset). Its bounds hold whether autoscaling is on or off: the stored count lies within them.
type Autoscale struct {
	Enabled      bool   `json:"enabled"`
	Min          *int32 `json:"minReplicas,omitempty"`
	Max          *int32 `json:"maxReplicas,omitempty"`
	CPUTarget    *int32 `json:"cpuTarget,omitempty"`
	MemoryTarget *int32 `json:"memoryTarget,omitempty"`
}

// Invalid says how the autoscaling block breaks the rules of the new console-api (spec 002's
// "invalid autoscaling block"), "" when it does not: a minimum above the maximum, a minimum or
// maximum below 1, a minimum above 1 without a maximum, autoscaling on without a maximum or
// without a target, a negative target while on. kip app autoscale refuses such a block, and the
// upgrade's check asks for a decision on an App that has one.
func (a Autoscale) Invalid() string {
	switch {
	case a.Min != nil && a.Max != nil && *a.Min > *a.Max:
		return fmt.Sprintf("its minimum %d is above its maximum %d", *a.Min, *a.Max)
	case a.Min != nil && *a.Min < 1:
		return fmt.Sprintf("its minimum %d is below 1", *a.Min)
	case a.Max != nil && *a.Max < 1:
		return fmt.Sprintf("its maximum %d is below 1", *a.Max)
	case a.Min != nil && *a.Min > 1 && a.Max == nil:
		return fmt.Sprintf("its minimum %d is above 1 without a maximum", *a.Min)
	case a.Enabled && a.Max == nil:
		return "autoscaling is on without a maximum"
	case a.Enabled && (a.CPUTarget != nil && *a.CPUTarget < 0 || a.MemoryTarget != nil && *a.MemoryTarget < 0):
		return "autoscaling is on with a negative target"
	case a.Enabled && !positive(a.CPUTarget) && !positive(a.MemoryTarget):
		return "autoscaling is on without a target"
	}
	return ""
}

func positive(p *int32) bool { return p != nil && *p > 0 }

// Bounds are the counts an App's stored count may take: from its minimum (1 when unset) to its
// maximum (none when unset).
type Bounds struct{ Lo, Hi int64 }

// Bounds are the block's bounds.
func (a Autoscale) Bounds() Bounds {
	b := Bounds{Lo: 1, Hi: math.MaxInt64}
	if a.Min != nil {
		b.Lo = int64(*a.Min)
	}
	if a.Max != nil {
		b.Hi = int64(*a.Max)
	}
	return b
}

// Holds reports whether n lies within the bounds.
func (b Bounds) Holds(n int32) bool { return int64(n) >= b.Lo && int64(n) <= b.Hi }

// Clamp is n moved into the bounds: their nearest end when it lies outside.
func (b Bounds) Clamp(n int32) int32 {
	switch {
	case int64(n) < b.Lo:
		return int32(b.Lo)
	case int64(n) > b.Hi:
		return int32(b.Hi)
	}
	return n
}

// Unbounded reports whether the bounds have no maximum.
func (b Bounds) Unbounded() bool { return b.Hi == math.MaxInt64 }

func (b Bounds) String() string {
	if b.Unbounded() {
		return fmt.Sprintf("%d or more", b.Lo)
	}
	return fmt.Sprintf("%d to %d", b.Lo, b.Hi)
}

// Choice is the range of counts to choose N from, for a message naming a command.
func (b Bounds) Choice() string {
	if b.Unbounded() {
		return fmt.Sprintf("with N of %d or more", b.Lo)
	}
	return fmt.Sprintf("with N from %d to %d", b.Lo, b.Hi)
}

// Describe says what the block is: on or off, its bounds and its targets.
func (a Autoscale) Describe() string {
	s := "off"
	if a.Enabled {
		s = "on"
	}
	s += ", bounds " + a.Bounds().String()
	if positive(a.CPUTarget) {
		s += fmt.Sprintf(", CPU target %d%%", *a.CPUTarget)
	}
	if positive(a.MemoryTarget) {
		s += fmt.Sprintf(", memory target %d%%", *a.MemoryTarget)
	}
	return s
}

// StartCount is the count an app starts at: its minimum when autoscaling is on, else its stored
// count.
func StartCount(stored int32, a Autoscale) int32 {
	if a.Enabled {
		return int32(a.Bounds().Lo)
	}
	return stored
}
