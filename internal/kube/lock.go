package kube

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/user"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/fault"
)

// The cluster lock is the Lease kube-system/kip-lock. Commands that change the cluster's shape
// (kip node add/remove/fence, the k3s and Longhorn upgrades) hold it while they run, renewing it
// every LeaseDuration/6; a lock whose holder stopped renewing it for LeaseDuration is stale and
// the next command takes it over. docs/records.md describes the Lease's fields.
const (
	LockName = "kip-lock"
	// LockTokenAnnotation holds the random token of the AcquireLock call that holds the lock, so
	// that two kip processes with the same holder text are still two holders.
	LockTokenAnnotation = RecordPrefix + "lock-token"
	// DefaultLeaseDuration is how long the lock outlives its holder's last renewal.
	DefaultLeaseDuration = time.Minute
	// RestartLeaseDuration is the lease of a command that restarts the server's k3s, whose API
	// holds the lock: it outlasts a restart (renewals fail for up to half of it before kip gives
	// the lock up), where the default minute would not.
	RestartLeaseDuration = 5 * time.Minute
	// releaseTimeout bounds Release, which runs after Ctrl-C on a context of its own.
	releaseTimeout = 10 * time.Second
)

// LockOptions tune AcquireLock; the zero value is what kip commands use.
type LockOptions struct {
	// LeaseDuration is how long the lock stays held after the last renewal, in whole seconds;
	// 0 means DefaultLeaseDuration. The holder renews it every sixth of that.
	LeaseDuration time.Duration
	// Namespace holds the Lease; "" means kube-system. Tests use a namespace of their own.
	Namespace string
}

// HolderText describes the running kip for the lock and records: the command, then who runs it
// where, e.g. "kip node add 203.0.113.11 by alice@laptop, pid 4242".
func HolderText(command string) string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = fmt.Sprintf("uid %d", os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown host"
	}
	return fmt.Sprintf("%s by %s@%s, pid %d", command, name, host, os.Getpid())
}

// LockHeldError refuses to take a lock that another kip command holds and renews.
type LockHeldError struct {
	Holder        string
	AcquiredAt    time.Time
	RenewedAgo    time.Duration
	LeaseDuration time.Duration
}

func (e *LockHeldError) Error() string {
	frees := "about a minute"
	if e.LeaseDuration != DefaultLeaseDuration {
		frees = e.LeaseDuration.String()
	}
	return fmt.Sprintf("another kip command holds the cluster lock: %s, since %s (renewed %ds ago); "+
		"wait for it to finish, or if it died, the lock frees itself %s after its last renewal",
		e.Holder, e.AcquiredAt.Local().Format("2006-01-02 15:04:05 MST"), int(e.RenewedAgo.Seconds()), frees)
}

// Lock is the held cluster lock. It renews itself until Release.
type Lock struct {
	// Holder is the holder text this lock was taken with.
	Holder string
	// TookOverFrom is the holder of a stale lock this one took over, "" when the lock was free.
	TookOverFrom string
	// TookOverBecause says why that lock was stale: "it stopped renewing it" or "its process no
	// longer runs".
	TookOverBecause string

	leases   coordinationclient.LeaseInterface
	token    string
	duration time.Duration

	stopRenewing context.CancelFunc
	renewDone    chan struct{}
	lost         chan struct{}
	lostErr      error // set before lost is closed

	release    sync.Once
	releaseErr error
}

// AcquireLock takes the cluster lock for holder (see HolderText). It refuses with a
// *LockHeldError while another holder renews it, and takes over a lock whose holder stopped
// renewing it for its lease duration, or whose holder was a kip on this machine that no longer
// runs, saying so in Lock.TookOverFrom. Every write is guarded by
// the Lease's resourceVersion, so of two kip commands taking the lock at once exactly one wins.
func AcquireLock(ctx context.Context, kube kubernetes.Interface, holder string, opts LockOptions) (*Lock, error) {
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.LeaseDuration < time.Second || opts.LeaseDuration%time.Second != 0 {
		return nil, fmt.Errorf("take the cluster lock: lease duration %s is not a whole number of seconds", opts.LeaseDuration)
	}
	if opts.Namespace == "" {
		opts.Namespace = RecordsNamespace
	}
	l := &Lock{
		Holder:   holder,
		leases:   kube.CoordinationV1().Leases(opts.Namespace),
		token:    rand.Text(),
		duration: opts.LeaseDuration,
		lost:     make(chan struct{}),
	}
	// Every run of a command takes the lock: a test build does not kill it after that write
	// when it kills each run after a write no run before it made.
	ctx = fault.Bookkeeping(ctx)
	for {
		tookOver, because, err := l.take(ctx)
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue // another kip wrote the Lease meanwhile: look again
		}
		if err != nil {
			var held *LockHeldError
			if errors.As(err, &held) {
				return nil, err
			}
			return nil, fmt.Errorf("take the cluster lock: %w", err)
		}
		l.TookOverFrom, l.TookOverBecause = tookOver, because
		// Renewals come with the clock: a test build does not number them among the writes.
		renewCtx, cancel := context.WithCancel(fault.Uncounted(context.Background()))
		l.stopRenewing = cancel
		l.renewDone = make(chan struct{})
		go l.renew(renewCtx)
		return l, nil
	}
}

// take writes this lock into the Lease once, returning the stale holder it replaced.
func (l *Lock) take(ctx context.Context) (tookOver, because string, err error) {
	now := metav1.NewMicroTime(time.Now())
	lease, err := l.leases.Get(ctx, LockName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LockName}}
		l.fill(lease, now)
		_, err = l.leases.Create(ctx, lease, metav1.CreateOptions{})
		return "", "", err
	}
	if err != nil {
		return "", "", err
	}
	if holder := ptr.Deref(lease.Spec.HolderIdentity, ""); holder != "" {
		renewed, duration := leaseRenewal(lease)
		ago := now.Sub(renewed)
		switch {
		case ago >= duration:
			because = "it stopped renewing it"
		case HolderGone(holder):
			because = "its process no longer runs"
		default:
			return "", "", &LockHeldError{
				Holder:        holder,
				AcquiredAt:    ptr.Deref(lease.Spec.AcquireTime, metav1.MicroTime{}).Time,
				RenewedAgo:    max(ago, 0),
				LeaseDuration: duration,
			}
		}
		tookOver = holder
	}
	transitions := ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1
	lease.Spec.LeaseTransitions = &transitions
	l.fill(lease, now)
	_, err = l.leases.Update(ctx, lease, metav1.UpdateOptions{})
	return tookOver, because, err
}

// holderText parses HolderText's "… by user@host, pid N".
var holderText = regexp.MustCompile(`by [^@]+@(\S+), pid (\d+)$`)

// HolderGone reports whether the holder (a Lease's holderIdentity, HolderText) is a kip process
// on this machine that no longer runs: its lock is stale at once rather than after its lease. A
// holder on another machine cannot be told apart from one that runs; its lease decides.
func HolderGone(holder string) bool {
	m := holderText.FindStringSubmatch(holder)
	if m == nil {
		return false
	}
	host, err := os.Hostname()
	if err != nil || m[1] != host {
		return false
	}
	pid, err := strconv.Atoi(m[2])
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// fill makes lease name this lock as its holder, acquired and renewed now.
func (l *Lock) fill(lease *coordinationv1.Lease, now metav1.MicroTime) {
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[LockTokenAnnotation] = l.token
	seconds := int32(l.duration / time.Second)
	lease.Spec.HolderIdentity = &l.Holder
	lease.Spec.LeaseDurationSeconds = &seconds
	lease.Spec.AcquireTime = &now
	lease.Spec.RenewTime = &now
}

// leaseRenewal returns when the Lease was last renewed (acquired, if never renewed; the zero
// time if neither is set) and how long it lasts after that.
func leaseRenewal(lease *coordinationv1.Lease) (time.Time, time.Duration) {
	duration := DefaultLeaseDuration
	if s := lease.Spec.LeaseDurationSeconds; s != nil {
		duration = time.Duration(*s) * time.Second
	}
	renewed := lease.Spec.RenewTime
	if renewed == nil {
		renewed = lease.Spec.AcquireTime
	}
	return ptr.Deref(renewed, metav1.MicroTime{}).Time, duration
}

// renew keeps the lock fresh until ctx ends. It gives the lock up as lost when another kip took
// it over, or when no renewal succeeded for half the lease duration: by the end of the lease
// another command may take it, and this one must stop before then.
func (l *Lock) renew(ctx context.Context) {
	defer close(l.renewDone)
	every := l.duration / 6
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	lastRenewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		err := l.renewOnce(ctx, every)
		var taken *lockTakenError
		switch {
		case ctx.Err() != nil:
			return
		case errors.As(err, &taken):
			l.lose(err)
			return
		case err == nil:
			lastRenewed = time.Now()
		case time.Since(lastRenewed) >= l.duration/2:
			l.lose(fmt.Errorf("lost the cluster lock: no renewal succeeded for %s: %w", time.Since(lastRenewed).Round(time.Second), err))
			return
		}
	}
}

type lockTakenError struct{ by string }

func (e *lockTakenError) Error() string {
	if e.by == "" {
		return "lost the cluster lock: it was released by someone else"
	}
	return "lost the cluster lock: it was taken over by " + e.by
}

func (l *Lock) renewOnce(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lease, err := l.leases.Get(ctx, LockName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return &lockTakenError{}
	}
	if err != nil {
		return err
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if lease.Annotations[LockTokenAnnotation] != l.token || holder == "" {
		return &lockTakenError{by: holder}
	}
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.RenewTime = &now
	_, err = l.leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

func (l *Lock) lose(err error) {
	l.lostErr = err
	close(l.lost)
}

// Lost is closed when the lock is lost: another kip took it over or renewing it failed for too
// long. Whoever holds the lock must stop changing the cluster then; Err says why.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err says why the lock was lost, and is nil while it is held.
func (l *Lock) Err() error {
	select {
	case <-l.lost:
		return l.lostErr
	default:
		return nil
	}
}

// Release stops renewing the lock and frees it, unless it was lost meanwhile. It works on a
// context of its own, detached from ctx's cancellation, so it still runs after Ctrl-C; calling
// it again does nothing and returns the first call's result.
func (l *Lock) Release(ctx context.Context) error {
	l.release.Do(func() {
		l.stopRenewing()
		<-l.renewDone
		if l.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(fault.Bookkeeping(context.WithoutCancel(ctx)), releaseTimeout)
		defer cancel()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			lease, err := l.leases.Get(ctx, LockName, metav1.GetOptions{})
			if err != nil || lease.Annotations[LockTokenAnnotation] != l.token {
				return err
			}
			delete(lease.Annotations, LockTokenAnnotation)
			lease.Spec.HolderIdentity = nil
			_, err = l.leases.Update(ctx, lease, metav1.UpdateOptions{})
			return err
		})
		if err != nil && !apierrors.IsNotFound(err) {
			l.releaseErr = fmt.Errorf("release the cluster lock: %w", err)
		}
	})
	return l.releaseErr
}
