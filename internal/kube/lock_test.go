package kube_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

func TestHolderText(t *testing.T) {
	got := kube.HolderText("kip node add 203.0.113.11")
	if !regexp.MustCompile(`^kip node add 203\.0\.113\.11 by \S+@\S+, pid \d+$`).MatchString(got) {
		t.Errorf("HolderText = %q", got)
	}
}

func TestLockHeldErrorMessage(t *testing.T) {
	acquired := time.Date(2026, 12, 1, 9, 30, 0, 0, time.Local)
	err := &kube.LockHeldError{
		Holder:        "kip node add 203.0.113.11 by alice@laptop, pid 4242",
		AcquiredAt:    acquired,
		RenewedAgo:    4 * time.Second,
		LeaseDuration: time.Minute,
	}
	want := "another kip command holds the cluster lock: kip node add 203.0.113.11 by alice@laptop, pid 4242, since " +
		acquired.Format("2006-01-02 15:04:05 MST") + " (renewed 4s ago); wait for it to finish, " +
		"or if it died, the lock frees itself about a minute after its last renewal"
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
}

// lockOpts keeps a test's lock in its own namespace.
func lockOpts(ns string, lease time.Duration) kube.LockOptions {
	return kube.LockOptions{Namespace: ns, LeaseDuration: lease}
}

func acquire(t *testing.T, env *testenv.Env, holder string, opts kube.LockOptions) *kube.Lock {
	t.Helper()
	l, err := kube.AcquireLock(t.Context(), env.Kube, holder, opts)
	if err != nil {
		t.Fatalf("acquire as %s: %v", holder, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

func refusedBy(t *testing.T, err error, holder string) {
	t.Helper()
	var held *kube.LockHeldError
	if !errors.As(err, &held) || held.Holder != holder || !strings.Contains(err.Error(), holder) {
		t.Fatalf("acquire error = %v, want LockHeldError naming %q", err, holder)
	}
}

func TestLockContentionAndRelease(t *testing.T) {
	env := testenv.Get(t)
	opts := lockOpts(env.Namespace(t), 2*time.Second)
	ctx := t.Context()

	a := acquire(t, env, "kip node add w1 by alice@laptop, pid 1", opts)
	if a.TookOverFrom != "" {
		t.Errorf("TookOverFrom = %q on a free lock", a.TookOverFrom)
	}
	_, err := kube.AcquireLock(ctx, env.Kube, "kip node remove w2 by bob@desk, pid 2", opts)
	refusedBy(t, err, a.Holder)
	// The same holder text from another process is still another holder.
	_, err = kube.AcquireLock(ctx, env.Kube, a.Holder, opts)
	refusedBy(t, err, a.Holder)

	// Renewals keep it held past its lease duration.
	time.Sleep(3 * time.Second)
	_, err = kube.AcquireLock(ctx, env.Kube, "kip node remove w2 by bob@desk, pid 2", opts)
	refusedBy(t, err, a.Holder)
	var held *kube.LockHeldError
	if errors.As(err, &held) && held.RenewedAgo >= 2*time.Second {
		t.Errorf("renewed %s ago, want under the lease duration", held.RenewedAgo)
	}

	// Release works on a cancelled context (after Ctrl-C) and twice.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Release(cancelled); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	b := acquire(t, env, "kip node remove w2 by bob@desk, pid 2", opts)
	if b.TookOverFrom != "" {
		t.Errorf("TookOverFrom = %q after a release", b.TookOverFrom)
	}
	select {
	case <-a.Lost():
		t.Error("a released lock reports itself lost")
	default:
	}
}

// abandon writes a Lease as a kip that died: held, last renewed long ago.
func abandon(t *testing.T, env *testenv.Env, ns, holder string) {
	t.Helper()
	renewed := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: kube.LockName, Annotations: map[string]string{kube.LockTokenAnnotation: "dead"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To[int32](60),
			AcquireTime:          &renewed,
			RenewTime:            &renewed,
		},
	}
	if _, err := env.Kube.CoordinationV1().Leases(ns).Create(t.Context(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestLockStaleTakeover(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	dead := "kip upgrade --longhorn by carol@ci, pid 77"
	abandon(t, env, ns, dead)

	l := acquire(t, env, "kip node fence w3 by alice@laptop, pid 5", lockOpts(ns, 0))
	if l.TookOverFrom != dead {
		t.Errorf("TookOverFrom = %q, want %q", l.TookOverFrom, dead)
	}
	lease, err := env.Kube.CoordinationV1().Leases(ns).Get(t.Context(), kube.LockName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != l.Holder {
		t.Errorf("holderIdentity = %q", got)
	}
	if got := ptr.Deref(lease.Spec.LeaseDurationSeconds, 0); got != 60 {
		t.Errorf("leaseDurationSeconds = %d, want 60", got)
	}
	if got := ptr.Deref(lease.Spec.LeaseTransitions, 0); got != 1 {
		t.Errorf("leaseTransitions = %d, want 1", got)
	}
}

// TestLockConcurrentTakers: of several kips taking over one stale lock at once, exactly one wins.
func TestLockConcurrentTakers(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	abandon(t, env, ns, "kip node add w1 by dead@host, pid 1")

	const takers = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []*kube.Lock
	)
	start := make(chan struct{})
	for i := range takers {
		wg.Go(func() {
			<-start
			l, err := kube.AcquireLock(t.Context(), env.Kube, fmt.Sprintf("kip node add w%d by x@y, pid %d", i, i), lockOpts(ns, 0))
			var held *kube.LockHeldError
			switch {
			case err == nil:
				mu.Lock()
				winners = append(winners, l)
				mu.Unlock()
			case !errors.As(err, &held):
				t.Errorf("taker %d: %v", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, l := range winners {
		_ = l.Release(context.Background())
	}
	if len(winners) != 1 {
		t.Fatalf("%d takers won the stale lock, want exactly 1", len(winners))
	}
}

// TestLockLostWhenStolen: a holder whose Lease was taken by someone else learns it at its next
// renewal, and its Release leaves the new holder alone.
func TestLockLostWhenStolen(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	l := acquire(t, env, "kip upgrade --longhorn by alice@laptop, pid 9", lockOpts(ns, 3*time.Second))

	leases := env.Kube.CoordinationV1().Leases(ns)
	thief := "kip node remove w2 by bob@desk, pid 3"
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // the holder renews meanwhile
		lease, err := leases.Get(ctx, kube.LockName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		lease.Spec.HolderIdentity = &thief
		lease.Annotations[kube.LockTokenAnnotation] = "thief"
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire after the lock was taken")
	}
	if want := "lost the cluster lock: it was taken over by " + thief; l.Err() == nil || l.Err().Error() != want {
		t.Errorf("Err() = %v, want %s", l.Err(), want)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := leases.Get(ctx, kube.LockName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(lease.Spec.HolderIdentity, ""); got != thief {
		t.Errorf("holder after the robbed Release = %q, want %q", got, thief)
	}
}

func TestLockOptionsRefuseFractionalSeconds(t *testing.T) {
	_, err := kube.AcquireLock(t.Context(), nil, "x", lockOpts("", 1500*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "not a whole number of seconds") {
		t.Errorf("err = %v", err)
	}
}

// TestLockHolderGoneOnThisMachine: a lock still within its lease, held by a kip on this machine
// whose process is gone (killed outright), is taken over at once; one whose process runs is not.
func TestLockHolderGoneOnThisMachine(t *testing.T) {
	env := testenv.Get(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		pid      int
		takeOver bool
	}{
		{"process gone", exited.Process.Pid, true},
		{"process runs", os.Getpid(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			holder := fmt.Sprintf("kip install by root@%s, pid %d", host, tc.pid)
			renewed := metav1.NewMicroTime(time.Now())
			lease := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: kube.LockName},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](60),
					AcquireTime: &renewed, RenewTime: &renewed},
			}
			if _, err := env.Kube.CoordinationV1().Leases(ns).Create(t.Context(), lease, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			l, err := kube.AcquireLock(t.Context(), env.Kube, "kip install by root@"+host+", pid 1", lockOpts(ns, 0))
			if !tc.takeOver {
				refusedBy(t, err, holder)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Release(context.Background()) })
			if l.TookOverFrom != holder {
				t.Errorf("TookOverFrom = %q, want %q", l.TookOverFrom, holder)
			}
		})
	}
}
