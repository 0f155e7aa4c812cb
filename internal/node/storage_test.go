package node

import (
	"strings"
	"testing"
	"time"

	"kipper.run/kip/internal/cluster"
)

// TestDiskSync reads the disk-sync check's output and decides from it: a fast disk eligible, a
// slow one refused or, with --ignore-slow-disk, overridden, and a stall of half the replica
// timeout refused whatever the flag.
func TestDiskSync(t *testing.T) {
	out := "mount /dev/vdb ext4\nbatch 0.0016\nbatch 0.0032\n"
	d, err := parseSync(out)
	if err != nil {
		t.Fatal(err)
	}
	if d.Source != "/dev/vdb" || d.FSType != "ext4" || d.Writes != 32 || d.Mean != 150*time.Microsecond || d.Stall != 3200*time.Microsecond {
		t.Errorf("parseSync = %+v", d)
	}
	if _, err := parseSync("mount /dev/vdb ext4\n"); err == nil {
		t.Error("parseSync without a batch: no error")
	}
	if _, err := parseSync("mount /dev/vdb ext4\nbatch soon\n"); err == nil {
		t.Error("parseSync of a bad batch: no error")
	}
	timeout := 8 * time.Second
	for _, tt := range []struct {
		name       string
		d          DiskSync
		ignoreSlow bool
		copies     string
		why        string
	}{
		{"fast", DiskSync{Source: "/dev/nvme0n1p3", FSType: "ext4", Writes: 128, Mean: 200 * time.Microsecond, Stall: 5000600 * time.Nanosecond}, false, cluster.CopiesEligible,
			"128 synced 4 KiB writes on /dev/nvme0n1p3 (ext4) took 200µs each on average, the slowest 16 together 5.001ms"},
		{"slow", DiskSync{Writes: 128, Mean: 12 * time.Millisecond, Stall: 300 * time.Millisecond}, false, cluster.CopiesRefused,
			"slower than 5ms: a copy there would slow every write to its volume (network block storage at /var/lib/longhorn usually is this slow); to accept it anyway, run kip node storage w1 --copies --ignore-slow-disk"},
		{"slow, accepted", DiskSync{Writes: 128, Mean: 12 * time.Millisecond, Stall: 300 * time.Millisecond}, true, cluster.CopiesOverridden,
			"slower than 5ms: accepted with --ignore-slow-disk"},
		{"a stall of half the timeout", DiskSync{Writes: 16, Mean: 250 * time.Millisecond, Stall: 4 * time.Second}, true, cluster.CopiesRefused,
			"a sync stall of 4s reaches half of Longhorn's replica timeout (8s), so a copy there would have its writes time out; --ignore-slow-disk cannot accept that"},
	} {
		copies, why := judgeSync(tt.d, timeout, tt.ignoreSlow, "w1")
		if copies != tt.copies || !strings.Contains(why, tt.why) {
			t.Errorf("%s: judgeSync = %s, %q; want %s, %q", tt.name, copies, why, tt.copies, tt.why)
		}
	}
}
