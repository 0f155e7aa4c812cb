package mover_test

import (
	"context"
	"testing"
	"time"

	"kipper.run/kip/internal/mover"
)

func copyTree(t *testing.T, src, dst string, o mover.Options) *mover.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return mover.Copy(ctx, src, dst, o)
}

func verifyTree(t *testing.T, src, dst string) *mover.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return mover.Verify(ctx, src, dst, mover.Options{})
}
