package stop

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	ctx, request := WithRequest(context.Background())
	if err := Check(ctx); err != nil {
		t.Fatalf("Check before a request = %v", err)
	}
	request()
	if err := Check(ctx); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Check after a request = %v, want ErrInterrupted", err)
	}
	if ctx.Err() != nil {
		t.Fatal("a stop request cancelled the context: the running command must finish")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Check(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Check on a cancelled context = %v", err)
	}
}

// TestOnSignals sends this process two real SIGINTs: the first asks to stop between commands,
// the second cancels.
func TestOnSignals(t *testing.T) {
	firsts := make(chan bool, 2)
	ctx, release := OnSignals(context.Background(), func(first bool) { firsts <- first })
	defer release()

	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if first := <-firsts; !first {
		t.Fatal("the first interrupt was not reported as the first")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !errors.Is(Check(ctx), ErrInterrupted) {
		if time.Now().After(deadline) {
			t.Fatal("the first interrupt did not mark the context as stopping")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatal("the first interrupt cancelled the context")
	}

	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if first := <-firsts; first {
		t.Fatal("the second interrupt was reported as the first")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the second interrupt did not cancel the context")
	}
}
