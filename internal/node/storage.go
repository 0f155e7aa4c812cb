package node

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
)

// The disk-sync check: how long the disk under Longhorn's directory takes to sync small writes.
// A replica on a slow disk stalls every write to its volume.
const (
	// SlowSync is the mean time to sync a 4 KiB write above which a disk is slow: local SSD and
	// NVMe disks sync well under it; network block storage usually does not.
	SlowSync = 5 * time.Millisecond
	// syncBatches batches of syncWrites writes each are measured.
	syncBatches = 8
	syncWrites  = 16
)

//go:embed disksync.sh
var diskSyncScript string

// DiskSync is what the disk-sync check measured on a node.
type DiskSync struct {
	// Source and FSType are the device and file system under Longhorn's directory.
	Source, FSType string
	// Writes is how many 4 KiB writes were synced, each before the next; Mean their mean time
	// to sync; Stall the longest batch of syncWrites writes, which holds any single stall.
	Writes int
	Mean   time.Duration
	Stall  time.Duration
}

func (d DiskSync) String() string {
	return fmt.Sprintf("%d synced 4 KiB writes on %s (%s) took %s each on average, the slowest %d together %s",
		d.Writes, d.Source, d.FSType, d.Mean.Round(time.Microsecond), syncWrites, d.Stall.Round(time.Microsecond))
}

// measureSync runs the disk-sync check on the host c reaches, ending early at a batch that
// takes stallLimit or longer.
func measureSync(ctx context.Context, c *sshx.Client, stallLimit time.Duration) (DiskSync, error) {
	out, err := c.Output(ctx, sshx.Command("sh", "-c", diskSyncScript, "kip-disk-sync", cluster.LonghornDir,
		strconv.Itoa(syncBatches), strconv.Itoa(syncWrites), strconv.FormatFloat(stallLimit.Seconds(), 'f', 3, 64)))
	if err != nil {
		return DiskSync{}, fmt.Errorf("measure how long %s's disk takes to sync small writes (%s): %w", c.Host(), cluster.LonghornDir, err)
	}
	return parseSync(string(out))
}

// parseSync reads the check's output.
func parseSync(out string) (DiskSync, error) {
	var d DiskSync
	var total time.Duration
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "mount":
			d.Source = f[1]
			if len(f) >= 3 {
				d.FSType = f[2]
			}
		case len(f) == 2 && f[0] == "batch":
			s, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return d, fmt.Errorf("the disk-sync check printed %q", line)
			}
			b := time.Duration(s * float64(time.Second))
			total += b
			d.Stall = max(d.Stall, b)
			d.Writes += syncWrites
		}
	}
	if d.Writes == 0 {
		return d, errors.New("the disk-sync check measured nothing: " + strings.TrimSpace(out))
	}
	d.Mean = total / time.Duration(d.Writes)
	return d, nil
}

// judgeSync decides from d whether a worker may hold copies of volumes: a stall of half
// Longhorn's replica timeout refuses it whatever the operator says, a slow disk only without
// --ignore-slow-disk (then recorded as overridden). It returns one of the Copies* values and why.
func judgeSync(d DiskSync, replicaTimeout time.Duration, ignoreSlow bool, worker string) (string, string) {
	if limit := replicaTimeout / 2; d.Stall >= limit {
		return cluster.CopiesRefused, fmt.Sprintf("%s: a sync stall of %s reaches half of Longhorn's replica timeout (%s), so a copy there would have its writes time out; --ignore-slow-disk cannot accept that",
			d, d.Stall.Round(time.Millisecond), replicaTimeout)
	}
	if d.Mean <= SlowSync {
		return cluster.CopiesEligible, d.String()
	}
	if ignoreSlow {
		return cluster.CopiesOverridden, fmt.Sprintf("%s, slower than %s: accepted with --ignore-slow-disk", d, SlowSync)
	}
	return cluster.CopiesRefused, fmt.Sprintf("%s, slower than %s: a copy there would slow every write to its volume (network block storage at %s usually is this slow); "+
		"to accept it anyway, run kip node storage %s --copies --ignore-slow-disk", d, SlowSync, cluster.LonghornDir, worker)
}

// checkCopies runs the disk-sync check on a worker and records whether it may hold copies of
// volumes, and the join that checked (its verification ID; "" for kip node storage).
func checkCopies(ctx context.Context, cl *kube.Clients, c *sshx.Client, worker string, ignoreSlow bool, join string) (string, string, error) {
	s, err := longhorn.ReadSettings(ctx, cl)
	if err != nil {
		return "", "", err
	}
	timeout := time.Duration(s.ReplicaTimeout) * time.Second
	d, err := measureSync(ctx, c, timeout/2)
	if err != nil {
		return "", "", err
	}
	copies, why := judgeSync(d, timeout, ignoreSlow, worker)
	if err := cluster.UpdateWorker(ctx, cl.Dynamic, worker, func(w *cluster.Worker) { w.Copies, w.CopiesWhy, w.CopiesJoin = copies, why, join }); err != nil {
		return "", "", err
	}
	return copies, why, placeCopies(ctx, cl, worker, cluster.MayHoldCopies(copies))
}

// placeCopies lets Longhorn place new copies of volumes on worker, or keeps them off it (its
// Longhorn node's allowScheduling), when that is not so already. Copies already there stay.
func placeCopies(ctx context.Context, cl *kube.Clients, worker string, allow bool) error {
	allowed, found, err := longhorn.SchedulingAllowed(ctx, cl, worker)
	if err != nil || (found && allowed == allow) {
		return err
	}
	if !found {
		return fmt.Errorf("Longhorn has no node %s yet: see Longhorn's pods there ('kubectl -n %s get pods -o wide --field-selector spec.nodeName=%s')", worker, longhorn.Namespace, worker)
	}
	return longhorn.AllowScheduling(ctx, cl, worker, allow)
}

// copiesPlaced reports whether Longhorn places new copies on worker exactly when its record lets
// it hold copies.
func copiesPlaced(ctx context.Context, cl *kube.Clients, worker, copies string) (bool, error) {
	allowed, found, err := longhorn.SchedulingAllowed(ctx, cl, worker)
	return err == nil && found && allowed == cluster.MayHoldCopies(copies), err
}

// StorageOptions is what kip node storage was asked to do.
type StorageOptions struct {
	Worker string
	// Copies repeats the disk check that decides whether the worker may hold copies of volumes;
	// IgnoreSlowDisk accepts a slow disk (recorded as an override).
	Copies         bool
	IgnoreSlowDisk bool

	Env
}

// Storage is kip node storage: with --copies, the disk-sync check of a worker, recorded.
func Storage(ctx context.Context, o *StorageOptions) error {
	if err := checkWorkerName(o.Worker); err != nil {
		return err
	}
	if !o.Copies {
		return cli.Usagef("say what to check: kip node storage %s --copies checks whether its disk may hold copies of volumes", o.Worker)
	}
	t, err := readWorker(ctx, o.Kube, o.Worker, "the server may always hold copies of volumes")
	if err != nil {
		return err
	}
	if t.worker.State != cluster.WorkerReady {
		return fmt.Errorf("worker %s is %s: run kip node add %s to finish its join, which ends with this check", o.Worker, t.worker.State, t.worker.Host)
	}
	c, err := o.Dial(ctx, t.worker.Host)
	if err != nil {
		return fmt.Errorf("the disk check runs over SSH, and kip cannot reach %s at %s: %w", o.Worker, t.worker.Host, err)
	}
	defer c.Close()
	o.Printer.StepStarted("Measure how long " + o.Worker + "'s disk takes to sync small writes")
	start := time.Now()
	copies, why, err := checkCopies(ctx, t.cl, c, o.Worker, o.IgnoreSlowDisk, "")
	if err != nil {
		return err
	}
	o.Printer.StepDone("Measured "+o.Worker+"'s disk", time.Since(start))
	return reportCopies(o.Printer, o.Worker, copies, why)
}

// reportCopies says what the disk check decided; a refused disk is an error for kip node storage.
func reportCopies(p *cli.Printer, worker, copies, why string) error {
	switch copies {
	case cluster.CopiesEligible:
		p.Success(fmt.Sprintf("Worker %s may hold copies of volumes: %s", worker, why))
	case cluster.CopiesOverridden:
		p.Warn(fmt.Sprintf("Worker %s may hold copies of volumes on a slow disk: %s", worker, why))
	default:
		return fmt.Errorf("worker %s may not hold copies of volumes: %s", worker, why)
	}
	return nil
}
