// Package stop carries an operator's request to stop (Ctrl-C) through a context.
//
// kip stops between remote commands, never in the middle of one: the first interrupt marks the
// context as stopping, and code about to start a remote command or a workflow step calls Check
// and returns ErrInterrupted. A second interrupt cancels the context outright.
package stop

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// ErrInterrupted is returned by Check once a stop was requested.
var ErrInterrupted = errors.New("interrupted: stopped before the next step; run the same command again to continue")

type key struct{}

type state struct{ requested atomic.Bool }

// WithRequest returns a context that can be marked as stopping, and the function that marks it.
func WithRequest(parent context.Context) (context.Context, func()) {
	s := &state{}
	return context.WithValue(parent, key{}, s), func() { s.requested.Store(true) }
}

// Check returns ErrInterrupted when a stop was requested on ctx, ctx's error when it is done,
// and nil otherwise.
func Check(ctx context.Context) error {
	if s, ok := ctx.Value(key{}).(*state); ok && s.requested.Load() {
		return ErrInterrupted
	}
	return ctx.Err()
}

// OnSignals returns a context that is marked as stopping on the first SIGINT or SIGTERM and
// cancelled on the second, and a function that releases the signal handler.
func OnSignals(parent context.Context, notify func(first bool)) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	ctx, request := WithRequest(ctx)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		first := true
		for {
			select {
			case <-ch:
				if notify != nil {
					notify(first)
				}
				if first {
					request()
					first = false
					continue
				}
				cancel()
				return
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}
