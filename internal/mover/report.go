// Package mover is the program that runs in a service move's copy and verify pods: it copies a
// volume's tree exactly (copy), proves the copy against the original (verify) and counts a tree
// for the move's estimate (scan). Each run ends with a Report: in full as the last line of the
// pod's log, and shortened to fit Kubernetes' 4 KiB termination message.
package mover

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ReportFormat is the version of Report's JSON form. A decoder refuses another.
const ReportFormat = 1

// Op is what a run did.
type Op string

// The operations.
const (
	OpCopy   Op = "copy"
	OpVerify Op = "verify"
	OpScan   Op = "scan"
)

// Result is how a run ended.
type Result string

// The results, each with its own exit code.
const (
	// Done: the copy is complete and flushed, the trees are the same, or the scan counted all.
	Done Result = "done"
	// Differ: verify found differences between the original and the copy.
	Differ Result = "differences"
	// OutOfSpace: the copy ran out of room (ENOSPC or EDQUOT) on the target.
	OutOfSpace Result = "out-of-space"
	// Failed: an entry could not be read or recreated, or the run could not start.
	Failed Result = "error"
)

// Exit codes of the mover program.
const (
	ExitDone        = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitDifferences = 3
	ExitOutOfSpace  = 4
)

// ExitCode is the exit code for r.
func (r Result) ExitCode() int {
	switch r {
	case Done:
		return ExitDone
	case Differ:
		return ExitDifferences
	case OutOfSpace:
		return ExitOutOfSpace
	}
	return ExitError
}

// ResultOfExit is the result an exit code stands for, for a pod that ended without a report.
func ResultOfExit(code int) (Result, bool) {
	switch code {
	case ExitDone:
		return Done, true
	case ExitDifferences:
		return Differ, true
	case ExitOutOfSpace:
		return OutOfSpace, true
	case ExitError:
		return Failed, true
	}
	return "", false
}

// Totals counts a tree: what a copy copied, a verify compared or a scan found.
type Totals struct {
	Files       int64 `json:"files"`       // regular files, each name once (hard links included)
	Directories int64 `json:"directories"` // including the tree's root
	Symlinks    int64 `json:"symlinks"`
	Special     int64 `json:"special"`   // device nodes, FIFOs and sockets
	HardLinks   int64 `json:"hardLinks"` // names of a regular file beyond its first
	Bytes       int64 `json:"bytes"`     // regular files' sizes, each file's data once
}

// Entries is the number of entries: files, directories, symlinks and special files.
func (t Totals) Entries() int64 { return t.Files + t.Directories + t.Symlinks + t.Special }

// Kind is what a difference is.
type Kind string

// The kinds of difference.
const (
	Missing Kind = "missing" // in the original, not in the copy
	Extra   Kind = "extra"   // in the copy, not in the original
	Changed Kind = "changed" // in both, with Attribute different
)

// Difference is one way the copy differs from the original. Original and Copy are the attribute's
// values on each side ("" for a missing side).
type Difference struct {
	Path      string `json:"path"` // relative to the trees' roots; "." is the root
	Kind      Kind   `json:"kind"`
	Attribute string `json:"attribute,omitempty"` // type, size, content, owner, group, mode, device, mtime, target, xattr NAME, hard link
	Original  string `json:"original,omitempty"`
	Copy      string `json:"copy,omitempty"`
}

func (d Difference) String() string {
	switch d.Kind {
	case Missing:
		return fmt.Sprintf("%s: missing from the copy (%s)", d.Path, d.Original)
	case Extra:
		return fmt.Sprintf("%s: not in the original (%s in the copy)", d.Path, d.Copy)
	}
	return fmt.Sprintf("%s: %s differs: %s in the original, %s in the copy", d.Path, d.Attribute, orNone(d.Original), orNone(d.Copy))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Report is what a run reports.
type Report struct {
	Format int    `json:"format"`
	Op     Op     `json:"op"`
	Result Result `json:"result"`
	Source string `json:"source,omitempty"`
	Target string `json:"target,omitempty"`
	Totals Totals `json:"totals"`
	// Seconds is the whole run; SyncSeconds the part of a copy spent flushing it to the volume.
	Seconds     float64 `json:"seconds"`
	SyncSeconds float64 `json:"syncSeconds,omitempty"`
	Workers     int     `json:"workers,omitempty"`
	// Differences are the first differences by path, at most the run's bound; DifferenceCount
	// counts them all.
	Differences     []Difference `json:"differences,omitempty"`
	DifferenceCount int64        `json:"differenceCount,omitempty"`
	// Error says what failed (Failed) or where room ran out (OutOfSpace), naming the path.
	Error string `json:"error,omitempty"`
	// Shortened, Omitted and Digest are set in the termination message only: whether anything
	// was cut to fit, the differences left out, and the SHA-256 of the full report's line in the
	// log.
	Shortened bool   `json:"shortened,omitempty"`
	Omitted   int    `json:"omitted,omitempty"`
	Digest    string `json:"digest,omitempty"`
}

// TerminationLimit is Kubernetes' limit on a container's termination message.
const TerminationLimit = 4096

// maxTerminationError is how much of an error a termination message keeps before differences.
const maxTerminationError = 1024

// Line is the full report as one line of JSON, as the log holds it.
func (r *Report) Line() []byte {
	b, err := json.Marshal(r)
	if err != nil { // a Report holds only strings and numbers
		panic(err)
	}
	return b
}

// Termination is the report shortened to under TerminationLimit bytes: the first differences that
// fit, the error cut to fit, and the digest of full, the line the log holds.
func (r *Report) Termination(full []byte) []byte {
	sum := sha256.Sum256(full)
	t := *r
	t.Digest = hex.EncodeToString(sum[:])
	t.Error = cut(t.Error, maxTerminationError) // the first differences matter more than a long error's end
	for {
		t.Shortened = t.Error != r.Error || t.Omitted > 0 || t.Source != r.Source || t.Target != r.Target
		b := t.Line()
		if len(b) < TerminationLimit {
			return b
		}
		switch {
		case len(t.Differences) > 0:
			t.Differences = t.Differences[:len(t.Differences)-1]
			t.Omitted = len(r.Differences) - len(t.Differences)
		case len(t.Error) > 0:
			t.Error = cut(t.Error, len(t.Error)-(len(b)-TerminationLimit)-64)
		default: // paths of characters JSON escapes
			t.Source, t.Target = cut(t.Source, len(t.Source)/2), cut(t.Target, len(t.Target)/2)
		}
	}
}

// cut shortens s to about n bytes, marking the cut.
func cut(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// Decode reads a report (a full one or a termination message), refusing anything that is not one.
func Decode(b []byte) (*Report, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r Report
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not a data mover report: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a data mover report: more after its JSON")
	}
	if r.Format != ReportFormat {
		return nil, fmt.Errorf("a data mover report of format %d; this kip reads format %d", r.Format, ReportFormat)
	}
	switch r.Op {
	case OpCopy, OpVerify, OpScan:
	default:
		return nil, fmt.Errorf("not a data mover report: unknown operation %q", r.Op)
	}
	switch r.Result {
	case Done, Differ, OutOfSpace, Failed:
	default:
		return nil, fmt.Errorf("not a data mover report: unknown result %q", r.Result)
	}
	for _, d := range r.Differences {
		switch d.Kind {
		case Missing, Extra, Changed:
		default:
			return nil, fmt.Errorf("not a data mover report: unknown difference %q at %s", d.Kind, d.Path)
		}
	}
	if r.DifferenceCount < int64(len(r.Differences)) || r.Omitted < 0 {
		return nil, errors.New("not a data mover report: it counts fewer differences than it lists")
	}
	return &r, nil
}

// FindFull finds the full report whose line in log has the SHA-256 digest (a termination
// message's Digest).
func FindFull(log []byte, digest string) (*Report, error) {
	for _, line := range bytes.Split(log, []byte("\n")) {
		sum := sha256.Sum256(line)
		if hex.EncodeToString(sum[:]) == digest {
			return Decode(line)
		}
	}
	return nil, fmt.Errorf("the log holds no report with digest %s (it was cut or rotated)", digest)
}
