package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/cli"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/internal/service"
)

// BenchmarkMoveDowntime moves, in the lab, a service that holds the data sets of bench/mover.sh:
// 2 GiB in 64 files of 32 MiB of random data, and 150,000 files of 4 KiB in 150 directories of 10
// subdirectories of 100 files. It reports how long the service was stopped, step by step from
// the stop to the start on Longhorn, against the estimate kip showed before it asked (spec 000:
// 10 MiB/s for copying and verifying, 3 ms per file and directory, 3 minutes to stop, detach and
// start), and checks the data on Longhorn byte for byte. Not part of make test:
//
//	make testenv build-fault k3s-standin
//	go test -run '^$' -bench MoveDowntime -benchtime 1x -timeout 60m ./test/e2e
func BenchmarkMoveDowntime(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	l := setUpMoveLab(ctx, b, writesHost)
	l.project(ctx, b, "bench", "prod")
	for i := range b.N {
		b.StopTimer()
		ref := service.Ref{Project: "bench", Environment: "prod", Name: fmt.Sprintf("db%d", i)}
		dir := l.service(ctx, b, ref, "1Gi", func(dir string) { benchData(b, dir) })
		want := movertest.Describe(b, dir)
		b.StartTimer()
		start := time.Now()
		r := l.kip(b, nil, moveArgs(ref)...)
		whole := time.Since(start)
		b.StopTimer()
		if r.ExitCode != 0 {
			b.Fatalf("the move: exit %d\n%s", r.ExitCode, r.Stderr)
		}
		l.checkOnLonghorn(ctx, b, ref, dir, want)
		steps, down := stepTimes(b, r.Stderr)
		est := estimate(b, r.Stderr)
		var table strings.Builder
		for _, s := range steps {
			fmt.Fprintf(&table, "  %8s  %s\n", cli.FormatDuration(s.took), s.what)
		}
		b.Logf("the move of %s: the service stopped for %s (the steps from the stop to the start), kip's estimate %s, kip ran %s:\n%s",
			ref, down.Round(time.Second), est, whole.Round(time.Second), table.String())
		b.ReportMetric(down.Seconds(), "s-stopped")
		b.ReportMetric(est.Seconds(), "s-estimated")
	}
}

// benchData writes bench/mover.sh's two data sets under dir.
func benchData(b testing.TB, dir string) {
	b.Helper()
	rng := rand.NewChaCha8([32]byte{'k', 'i', 'p'})
	big := make([]byte, 32<<20)
	if err := os.MkdirAll(filepath.Join(dir, "big"), 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range 64 {
		_, _ = rng.Read(big)
		if err := os.WriteFile(filepath.Join(dir, "big", fmt.Sprintf("f%02d", i)), big, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	small := make([]byte, 4<<10)
	for d := range 150 {
		for s := range 10 {
			sub := filepath.Join(dir, "small", fmt.Sprintf("d%03d", d), fmt.Sprintf("s%d", s))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				b.Fatal(err)
			}
			for f := range 100 {
				_, _ = rng.Read(small)
				if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d", f)), small, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

type stepTime struct {
	what string
	took time.Duration
}

// stepDone is a step kip finished: "✔ what (1m05s)".
var stepDone = regexp.MustCompile(`(?m)^\s*✔ (.+) \(([0-9hms.]+)\)$`)

// stepTimes are the steps kip reports finished in its output, and how long the service was
// stopped: the steps from its stop to its start on Longhorn.
func stepTimes(b testing.TB, out string) ([]stepTime, time.Duration) {
	b.Helper()
	var steps []stepTime
	var down time.Duration
	stopped := false
	for _, m := range stepDone.FindAllStringSubmatch(out, -1) {
		d, err := time.ParseDuration(m[2])
		if err != nil {
			b.Fatalf("step %q took %q: %v", m[1], m[2], err)
		}
		steps = append(steps, stepTime{m[1], d})
		stopped = stopped || strings.HasPrefix(m[1], "Stopped service ")
		if stopped {
			down += d
		}
	}
	if !stopped || !strings.Contains(out, "runs on Longhorn") {
		b.Fatalf("no stop and start in kip's output:\n%s", out)
	}
	return steps, down
}

// estimate is the downtime kip estimated before it asked.
func estimate(b testing.TB, out string) time.Duration {
	b.Helper()
	m := regexp.MustCompile(`The service is stopped for about ([0-9hms.]+) `).FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no estimate in kip's output:\n%s", out)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		b.Fatal(err)
	}
	return d
}
