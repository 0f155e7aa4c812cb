package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
)

const (
	// stateDir records a lab: what it is (lab.json), the hosts' keys, logs and pids, apt-cacher-ng.
	stateDir = "/run/kip-lab"
	// diskDir holds the hosts' disks: overlays on the base image, and Longhorn disks.
	diskDir = "/var/lib/kip-lab"
	// lockPath is held by the process that owns the lab, from Up to Down.
	lockPath = "/run/kip-lab.lock"
	// maxHosts keeps the hosts' addresses (.11 up) within the /24s.
	maxHosts = 40
)

var (
	statePath = filepath.Join(stateDir, "lab.json")
	hostName  = regexp.MustCompile(`^lab[0-9]+$`)
	// moduleName is what HostOptions.Modules takes: the shim is written with these names.
	moduleName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

// Options shape a lab.
type Options struct {
	// Hosts sizes the hosts: Hosts[i] is host i+1; hosts beyond it get the zero HostOptions.
	Hosts []HostOptions
	// ReadOnly lists directories or files of this machine bound read-only into every host.
	ReadOnly []Bind
	// Persistent leaves the lab up when this process exits, for Attach and `make lab-down`
	// (kiplab up). Otherwise a lab whose process died is removed by the next Up.
	Persistent bool
	// Logf, if not nil, receives progress.
	Logf func(format string, args ...any)
}

// HostOptions size a host as kip sees it: MemTotal in /proc/meminfo and the count nproc prints.
// Zero leaves this machine's figure.
type HostOptions struct {
	MemoryMiB int
	CPUs      int
	// Modules are kernel modules the host pretends it can load (this machine's kernel loads
	// none): a modprobe first on root's PATH answers `modprobe M` and `modprobe -n -q M` with
	// success for them, and runs the real modprobe for anything else. Nothing loads and
	// /sys/module does not change, so kip's facts report such a module loadable, never loaded.
	Modules []string
	// LonghornDiskGiB, when positive, gives the host a file system of its own at
	// /var/lib/longhorn, of that size: a real ext4 on a sparse image file, loop-mounted on this
	// machine and bound into the host, so that df there shows that size rather than this
	// machine's root file system. It keeps what is written across Stop, Kill and Start; Down
	// removes it.
	LonghornDiskGiB int
}

// Bind is a path of this machine bound into the hosts at Target (Source when empty).
type Bind struct {
	Source string
	Target string
}

// Lab is a set of running hosts.
type Lab struct {
	Hosts []*Host
	// KnownHostsPath is the known_hosts file Host.Run verifies host keys with.
	KnownHostsPath string

	st   state
	lock *flock.Flock // nil for an attached lab
	logf func(format string, args ...any)
}

// state is what lab.json records.
type state struct {
	Persistent bool        `json:"persistent"`
	Image      string      `json:"image"` // the unpacked base image: the hosts' lower layer
	ReadOnly   []Bind      `json:"readOnly,omitempty"`
	Hosts      []hostState `json:"hosts"`
}

type hostState struct {
	Name      string   `json:"name"`
	Index     int      `json:"index"` // from 1
	MemoryMiB int      `json:"memoryMiB,omitempty"`
	CPUs      int      `json:"cpus,omitempty"`
	Modules   []string `json:"modules,omitempty"`
	// LonghornDiskGiB is HostOptions.LonghornDiskGiB.
	LonghornDiskGiB int `json:"longhornDiskGiB,omitempty"`
}

// Up brings up a lab of n hosts, lab1 to labN, and returns once each accepts SSH and systemd has
// finished starting it. It waits while another process owns a lab. On failure it removes what it
// created.
func Up(ctx context.Context, n int, opts Options) (*Lab, error) {
	if n < 1 || n > maxHosts {
		return nil, fmt.Errorf("a lab has 1 to %d hosts, not %d", maxHosts, n)
	}
	if len(opts.Hosts) > n {
		return nil, fmt.Errorf("%d host sizes given for %d hosts", len(opts.Hosts), n)
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, b := range opts.ReadOnly {
		if !filepath.IsAbs(b.Source) || (b.Target != "" && !filepath.IsAbs(b.Target)) {
			return nil, fmt.Errorf("bind %s:%s: paths must be absolute", b.Source, b.Target)
		}
	}
	for _, h := range opts.Hosts {
		if h.LonghornDiskGiB < 0 {
			return nil, fmt.Errorf("a Longhorn disk of %d GiB: give 0 for none or a positive size", h.LonghornDiskGiB)
		}
		for _, m := range h.Modules {
			if !moduleName.MatchString(m) {
				return nil, fmt.Errorf("%q is not a kernel module name", m)
			}
		}
	}
	lock := flock.New(lockPath)
	unlock, st, err := acquire(ctx, lock, logf)
	if err != nil {
		return nil, err
	}
	if st != nil {
		unlock()
		return nil, errors.New("a lab brought up by make lab-up is running: use it with lab.Attach or remove it with make lab-down")
	}
	l := &Lab{KnownHostsPath: filepath.Join(stateDir, "known_hosts"), lock: lock, logf: logf}
	l.st = state{Persistent: opts.Persistent, ReadOnly: opts.ReadOnly}
	for i := range n {
		hs := hostState{Name: fmt.Sprintf("lab%d", i+1), Index: i + 1}
		if i < len(opts.Hosts) {
			o := opts.Hosts[i]
			hs.MemoryMiB, hs.CPUs, hs.Modules, hs.LonghornDiskGiB = o.MemoryMiB, o.CPUs, o.Modules, o.LonghornDiskGiB
		}
		l.st.Hosts = append(l.st.Hosts, hs)
	}
	if err := l.up(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("bring the lab up: %w", err), l.Down(context.WithoutCancel(ctx)))
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context) error {
	start := time.Now()
	// The guard routes come first: from here on, nothing for the lab's ranges leaves the machine.
	if err := addRoutes(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	if err := raiseInotifyInstances(l.logf); err != nil {
		return err
	}
	if err := l.save(); err != nil { // before anything exists that Down would have to find
		return err
	}
	if err := netUp(ctx); err != nil {
		return err
	}
	img, err := ensureImage(ctx, true, l.logf)
	if err != nil {
		return err
	}
	l.st.Image = img
	if err := l.save(); err != nil {
		return err
	}
	mirrors, err := machineMirrors()
	if err != nil {
		return err
	}
	for _, hs := range l.st.Hosts {
		h := l.newHost(hs)
		if err := h.create(ctx, l.st.Hosts, mirrors); err != nil {
			return fmt.Errorf("create %s: %w", h.Name, err)
		}
		if err := h.boot(); err != nil {
			return fmt.Errorf("boot %s: %w", h.Name, err)
		}
		l.Hosts = append(l.Hosts, h)
	}
	err = l.each(func(h *Host) error {
		state, err := h.waitReady(ctx)
		if err != nil {
			return err
		}
		if state != "running" {
			failed, _ := h.Run(ctx, "systemctl --failed --plain --no-legend")
			return fmt.Errorf("%s booted %s: failed units: %s", h.Name, state, strings.TrimSpace(failed))
		}
		return nil
	})
	if err != nil {
		return err
	}
	l.logf("lab: %d hosts up in %s", len(l.Hosts), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// each runs f for every host at once and joins the errors.
func (l *Lab) each(f func(*Host) error) error {
	errs := make([]error, len(l.Hosts))
	var wg sync.WaitGroup
	for i, h := range l.Hosts {
		wg.Go(func() { errs[i] = f(h) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (l *Lab) save() error {
	b, err := json.MarshalIndent(l.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, statePath)
}

// Attach returns the lab brought up by `make lab-up` (kiplab up). Down on it removes it.
func Attach() (*Lab, error) {
	st, err := loadState()
	if err != nil {
		return nil, err
	}
	if st == nil || !st.Persistent {
		return nil, errors.New("no lab is up: bring one up with make lab-up")
	}
	l := &Lab{KnownHostsPath: filepath.Join(stateDir, "known_hosts"), st: *st, logf: func(string, ...any) {}}
	for _, hs := range st.Hosts {
		l.Hosts = append(l.Hosts, l.newHost(hs))
	}
	return l, nil
}

// Host returns the host called name, or nil.
func (l *Lab) Host(name string) *Host {
	for _, h := range l.Hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// Down removes the lab: its hosts and their disks, network namespaces, bridges and
// apt-cacher-ng. The base image, the apt cache and the unreachable routes stay.
func (l *Lab) Down(ctx context.Context) error {
	for _, h := range l.Hosts {
		h.closeClient()
	}
	if l.lock == nil { // attached
		l.lock = flock.New(lockPath)
		if _, err := l.lock.TryLockContext(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("lock %s: %w", lockPath, err)
		}
	}
	err := teardown(ctx, &l.st)
	l.lock.Unlock()
	if err != nil {
		return fmt.Errorf("remove the lab: %w", err)
	}
	return nil
}

// Teardown removes whatever lab is up on this machine, or what is left of one, as Down does.
// It waits while a process owns a lab.
func Teardown(ctx context.Context) error {
	lock := flock.New(lockPath)
	if _, err := lock.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return fmt.Errorf("lock %s: %w", lockPath, err)
	}
	defer lock.Unlock()
	st, err := loadState()
	if err != nil {
		return err
	}
	if st == nil {
		st = &state{}
	}
	if err := teardown(ctx, st); err != nil {
		return fmt.Errorf("remove the lab: %w", err)
	}
	return nil
}

// RemoveRoutes removes the unreachable routes for the lab's ranges, which Down leaves; it refuses
// while a lab is up.
func RemoveRoutes(ctx context.Context) error {
	lock := flock.New(lockPath)
	if _, err := lock.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return fmt.Errorf("lock %s: %w", lockPath, err)
	}
	defer lock.Unlock()
	if _, err := os.Stat(stateDir); err == nil {
		return errors.New("a lab is up: remove it first (make lab-down)")
	}
	return deleteRoutes(ctx)
}

// acquire takes the lab lock, waiting for another process's lab to go, and removes what a
// dead process left. It returns the function that releases the lock and the state of a
// persistent lab if one is up (nil if none).
func acquire(ctx context.Context, lock *flock.Flock, logf func(string, ...any)) (func(), *state, error) {
	ok, err := lock.TryLock()
	if err == nil && !ok {
		logf("lab: waiting for another process's lab to be removed (%s)", lockPath)
		_, err = lock.TryLockContext(ctx, 200*time.Millisecond)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	unlock := func() { lock.Unlock() }
	st, err := loadState()
	if err != nil {
		unlock()
		return nil, nil, err
	}
	if st != nil && st.Persistent {
		return unlock, st, nil
	}
	if _, serr := os.Stat(stateDir); st != nil || serr == nil {
		logf("lab: removing a lab left by a process that ended")
		if st == nil {
			st = &state{}
		}
		if err := teardown(ctx, st); err != nil {
			unlock()
			return nil, nil, fmt.Errorf("remove a lab left behind: %w", err)
		}
	}
	return unlock, nil, nil
}

// loadState reads lab.json; nil when there is none.
func loadState() (*state, error) {
	b, err := os.ReadFile(statePath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", statePath, err)
	}
	return &st, nil
}

// teardown removes every part of the lab st describes, and hosts found in the state and disk
// directories that st does not name. Parts already gone are skipped; errors are collected so
// that one stuck part does not leave the others.
func teardown(ctx context.Context, st *state) error {
	names := map[string]bool{}
	for _, hs := range st.Hosts {
		names[hs.Name] = true
	}
	for _, dir := range []string{stateDir, diskDir} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() && hostName.MatchString(e.Name()) {
				names[e.Name()] = true
			}
		}
	}
	netns, _ := os.ReadDir("/run/netns")
	for _, e := range netns {
		if n, ok := strings.CutPrefix(e.Name(), netnsPrefix); ok && hostName.MatchString(n) {
			names[n] = true
		}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name := range names {
		wg.Go(func() {
			if err := removeHost(ctx, name); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	errs = append(errs, netDown(ctx))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.RemoveAll(diskDir); err != nil {
		return err
	}
	return os.RemoveAll(stateDir)
}

// MinInotifyInstances is the least fs.inotify.max_user_instances the lab runs with. Every lab
// host's processes run as this machine's root (no user namespace), so root's inotify instances
// are shared by all of them; the kernel's default, 128, runs out with seven hosts' kubelets,
// containerds and pods ("inotify_init: too many open files", and the kubelet exits). k3s
// recommends 8192 on real nodes.
const MinInotifyInstances = 8192

const inotifyInstancesPath = "/proc/sys/fs/inotify/max_user_instances"

// raiseInotifyInstances raises the machine's fs.inotify.max_user_instances to
// MinInotifyInstances when it is lower (it is never lowered, and stays until the next boot).
func raiseInotifyInstances(logf func(string, ...any)) error {
	data, err := os.ReadFile(inotifyInstancesPath)
	if err != nil {
		return fmt.Errorf("read %s: %w", inotifyInstancesPath, err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("read %s: %w", inotifyInstancesPath, err)
	}
	if cur >= MinInotifyInstances {
		return nil
	}
	if err := os.WriteFile(inotifyInstancesPath, []byte(strconv.Itoa(MinInotifyInstances)), 0o644); err != nil {
		return fmt.Errorf("raise %s from %d to %d: %w", inotifyInstancesPath, cur, MinInotifyInstances, err)
	}
	logf("lab: raised fs.inotify.max_user_instances from %d to %d: the hosts' processes share this machine's root's instances", cur, MinInotifyInstances)
	return nil
}
