package app

import (
	"context"

	"kipper.run/kip/internal/kube"
)

// What the API tests (package app_test, which runs the console stand-in that imports this
// package) call of the commands' writes.

// Set is write of one value: the generation-tested patch every command but start writes.
func Set(ctx context.Context, cl *kube.Clients, a *App, doing, path string, value any) error {
	return write(ctx, cl, a, doing, set(path, value))
}

// RemoveStop is removeStop: the test-guarded removal of a's stop.
func RemoveStop(ctx context.Context, cl *kube.Clients, a *App) error { return removeStop(ctx, cl, a) }
