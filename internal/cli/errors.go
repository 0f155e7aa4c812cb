package cli

import (
	"errors"
	"fmt"
)

// Exit codes. They are mapped from errors only in main.
const (
	ExitOK       = 0
	ExitFailed   = 1
	ExitUsage    = 2
	ExitDecision = 3
)

// UsageError is a mistake in how kip was called: a bad flag, a missing argument.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// DecisionError means the command found something an operator must decide, such as
// upgrade --check findings; it exits 3.
type DecisionError struct{ Err error }

func (e *DecisionError) Error() string { return e.Err.Error() }
func (e *DecisionError) Unwrap() error { return e.Err }

// ExitCode maps an error to kip's exit code.
func ExitCode(err error) int {
	var usage *UsageError
	var decision *DecisionError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &usage), errors.Is(err, ErrYesRequired), errors.Is(err, ErrNoTerminal):
		return ExitUsage
	case errors.As(err, &decision):
		return ExitDecision
	default:
		return ExitFailed
	}
}
