package loop

import (
	"os"
	"path/filepath"
	"testing"

	"kipper.run/kip/test/need"
)

// TestAttachDetach binds a sparse image to a loop device of its own and detaches it again: found
// by its path and by its inode, of its file's size, gone after DetachFiles.
func TestAttachDetach(t *testing.T) {
	need.Root(t)
	img := filepath.Join(t.TempDir(), "volume.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 8<<20); err != nil {
		t.Fatal(err)
	}
	d, err := Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DetachFiles(img) }) //nolint:errcheck // after a failure only
	if Find(img) != d.Number || !d.BoundTo(img) || Backing(SysBlock)[d.Number] != img {
		t.Errorf("%s: found as %d, bound %v, backing %q", d.Path, Find(img), d.BoundTo(img), Backing(SysBlock)[d.Number])
	}
	size, err := os.ReadFile(filepath.Join(SysBlock, filepath.Base(d.Path), "size"))
	if err != nil || string(size) != "16384\n" { // 512-byte sectors
		t.Errorf("%s: %q sectors, %v", d.Path, size, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed with nothing else holding it, autoclear has unbound it.
	if n := Find(img); n >= 0 {
		detached, err := DetachFiles(img)
		t.Errorf("/dev/loop%d still bound after its last close; DetachFiles: %v, %v", n, detached, err)
	}

	d, err = Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	held, err := Open(d.Number) // another holder, as a mount is
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	detached, err := DetachFiles(img, filepath.Join(t.TempDir(), "volume.img"))
	if err != nil || len(detached) != 1 {
		t.Errorf("DetachFiles: %v, %v", detached, err)
	}
	held.Close() // a device still held is unbound when its last holder goes
	if n := Find(img); n >= 0 {
		t.Errorf("/dev/loop%d still bound after DetachFiles and the last close", n)
	}
}
