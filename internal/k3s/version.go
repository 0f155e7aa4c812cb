// Package k3s knows k3s releases: how kip moves an installed server to the release it pins.
package k3s

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
)

// MoveKind is what kip does with a server's k3s.
type MoveKind string

// The moves kip makes: Kubernetes upgrades a control plane one minor at a time and never
// downgrades it.
const (
	Install    MoveKind = "install"     // nothing installed: install the pin
	Keep       MoveKind = "keep"        // already on the pin
	Upgrade    MoveKind = "upgrade"     // a newer patch or k3s revision, or the next minor
	KeepBehind MoveKind = "keep-behind" // more than one minor behind: keep it, and warn
)

// Move is the plan for one server's k3s.
type Move struct {
	Kind MoveKind
	From string // installed release, "" when none
	To   string // the release k3s runs after the move
	// Warning explains a KeepBehind move.
	Warning string
}

// PlanMove decides how to move a server from the installed k3s release (empty when none) to
// the pinned one. A downgrade is an error: kip never moves k3s backwards.
func PlanMove(installed, pinned string) (Move, error) {
	to, err := parse(pinned)
	if err != nil {
		return Move{}, fmt.Errorf("pinned k3s: %w", err)
	}
	if installed == "" {
		return Move{Kind: Install, To: pinned}, nil
	}
	from, err := parse(installed)
	if err != nil {
		return Move{}, fmt.Errorf("installed k3s: %w", err)
	}
	switch cmp := compare(from, to); {
	case cmp == 0:
		return Move{Kind: Keep, From: installed, To: installed}, nil
	case cmp > 0:
		return Move{}, fmt.Errorf("k3s %s on the server is newer than %s, which this kip pins, and k3s is never downgraded: use a kip release that pins %s or later", installed, pinned, installed)
	}
	behind := minorsBetween(from, to)
	if behind > 1 {
		next := fmt.Sprintf("v%d.%d", from.Major(), from.Minor()+1)
		return Move{Kind: KeepBehind, From: installed, To: installed, Warning: fmt.Sprintf(
			"k3s %s on the server is %d Kubernetes minors behind %s, and Kubernetes upgrades a control plane one minor at a time: kip keeps %s; upgrade it through %s first",
			installed, behind, pinned, installed, next)}, nil
	}
	return Move{Kind: Upgrade, From: installed, To: pinned}, nil
}

// parse reads a k3s release such as v1.37.2+k3s1.
func parse(s string) (*version.Version, error) {
	v, err := version.ParseSemantic(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a k3s release like v1.37.2+k3s1", s)
	}
	return v, nil
}

// compare orders two releases by Kubernetes version, then by k3s revision (the +k3sN suffix,
// which semantic versioning itself leaves unordered).
func compare(a, b *version.Version) int {
	ra, rb := revision(a), revision(b)
	switch {
	case a.LessThan(b):
		return -1
	case a.GreaterThan(b):
		return 1
	case ra < rb:
		return -1
	case ra > rb:
		return 1
	}
	return 0
}

// revision is N of a +k3sN build, 0 without one.
func revision(v *version.Version) int {
	var n int
	if _, err := fmt.Sscanf(v.BuildMetadata(), "k3s%d", &n); err != nil {
		return 0
	}
	return n
}

// minorsBetween counts Kubernetes minor releases from a up to b (b newer).
func minorsBetween(a, b *version.Version) int {
	if a.Major() != b.Major() {
		return 1 << 10 // no Kubernetes major upgrade is a single step
	}
	return int(b.Minor()) - int(a.Minor())
}

// KubeletSkew is how many Kubernetes minors a worker's kubelet may be behind its server: the
// limit of the Kubernetes version skew policy for kubelets from 1.25 on.
const KubeletSkew = 3

// Compare orders two k3s releases (-1, 0 or 1): by Kubernetes version, then by k3s revision.
func Compare(a, b string) (int, error) {
	va, vb, err := parsePair(a, b)
	if err != nil {
		return 0, err
	}
	return compare(va, vb), nil
}

// MinorsBehind is how many Kubernetes minors release a is behind release b (0 or less when it
// is not behind).
func MinorsBehind(a, b string) (int, error) {
	va, vb, err := parsePair(a, b)
	if err != nil {
		return 0, err
	}
	return minorsBetween(va, vb), nil
}

func parsePair(a, b string) (*version.Version, *version.Version, error) {
	va, err := parse(a)
	if err != nil {
		return nil, nil, err
	}
	vb, err := parse(b)
	return va, vb, err
}
