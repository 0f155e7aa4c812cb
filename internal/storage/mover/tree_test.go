package mover_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kipper.run/kip/internal/storage/mover"
	"kipper.run/kip/test/need"
)

// The tests' filesystems are real: tmpfs, and ext4 on a loop device the test attaches itself
// (mount -o loop). Every mount is nodev and nosuid, and the only device node a test creates is
// a block node of its own loop device.

// mountTmpfs mounts a tmpfs of size (e.g. "64m") at a new directory.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	need.Root(t)
	dir := t.TempDir()
	mount(t, "-t", "tmpfs", "-o", "nodev,nosuid,size="+size, "tmpfs", dir)
	return dir
}

// mountExt4 makes an ext4 filesystem of size in an image file and mounts it on its own loop
// device; it returns the mount and the loop device's number.
func mountExt4(t *testing.T, size string) (string, uint64) {
	t.Helper()
	need.Root(t)
	mkfs := need.Command(t, "mkfs.ext4", "make test-deps installs e2fsprogs")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("truncate", "-s", size, img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v: %s", err, out)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	mount(t, "-t", "ext4", "-o", "loop,nodev,nosuid", img, mnt)
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return mnt, st.Dev
}

func mount(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
		need.Missing(t, "mount %s: %v: %s", strings.Join(args, " "), err, out)
	}
	dir := args[len(args)-1]
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// subdir makes an empty directory in dir.
func subdir(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	past    = unix.Timespec{Sec: 1577934245, Nsec: 123456789} // 2020-01-02T03:04:05.123456789Z
	earlier = unix.Timespec{Sec: 1262304000, Nsec: 987654321}
)

// treeBuilder writes a tree with every kind of entry a volume can hold.
type treeBuilder struct {
	t    *testing.T
	root string
}

func (b treeBuilder) path(rel string) string { return filepath.Join(b.root, rel) }

func (b treeBuilder) check(err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b treeBuilder) file(rel string, data []byte, mode uint32, uid, gid int) {
	b.t.Helper()
	b.check(os.WriteFile(b.path(rel), data, 0o600))
	b.own(rel, mode, uid, gid)
}

func (b treeBuilder) own(rel string, mode uint32, uid, gid int) {
	b.t.Helper()
	b.check(os.Lchown(b.path(rel), uid, gid))
	b.check(unix.Fchmodat(unix.AT_FDCWD, b.path(rel), mode, 0))
}

func (b treeBuilder) dir(rel string, mode uint32, uid, gid int) {
	b.t.Helper()
	b.check(os.Mkdir(b.path(rel), 0o700))
	b.own(rel, mode, uid, gid)
}

// sparse writes a file of size whose data is only at the offsets given.
func (b treeBuilder) sparse(rel string, size int64, data map[int64][]byte) {
	b.t.Helper()
	f, err := os.OpenFile(b.path(rel), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	b.check(err)
	for off, d := range data {
		_, err := f.WriteAt(d, off)
		b.check(err)
	}
	b.check(f.Truncate(size))
	b.check(f.Close())
}

func (b treeBuilder) symlink(target, rel string, uid, gid int) {
	b.t.Helper()
	b.check(os.Symlink(target, b.path(rel)))
	b.check(os.Lchown(b.path(rel), uid, gid))
}

func (b treeBuilder) mknod(rel string, mode uint32, dev uint64, uid, gid int) {
	b.t.Helper()
	b.check(unix.Mknod(b.path(rel), mode, int(dev)))
	b.own(rel, mode&0o7777, uid, gid)
}

func (b treeBuilder) xattr(rel, name string, value []byte) {
	b.t.Helper()
	b.check(unix.Lsetxattr(b.path(rel), name, value, 0))
}

func (b treeBuilder) setfacl(args ...string) {
	b.t.Helper()
	tool := need.Command(b.t, "setfacl", "make test-deps installs acl")
	cmd := exec.Command(tool, args...)
	cmd.Dir = b.root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.t.Fatalf("setfacl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (b treeBuilder) times(rel string, ts unix.Timespec) {
	b.t.Helper()
	b.check(unix.UtimesNanoAt(unix.AT_FDCWD, b.path(rel), []unix.Timespec{earlier, ts}, unix.AT_SYMLINK_NOFOLLOW))
}

// fileCaps is a security.capability value (VFS_CAP_REVISION_2, effective) granting
// CAP_NET_BIND_SERVICE.
func fileCaps() []byte {
	v := make([]byte, 20)
	binary.LittleEndian.PutUint32(v, 0x02000001)
	binary.LittleEndian.PutUint32(v[4:], 1<<10)
	return v
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// makeTree writes the test tree into root. blockDev, when not 0, is the test's own loop device, of
// which the tree gets a block node.
func makeTree(t *testing.T, root string, blockDev uint64) {
	b := treeBuilder{t, root}
	b.file("empty", nil, 0o644, 0, 0)
	b.file("notes.txt", []byte("notes\n"), 0o640, 1001, 1002)
	b.file("small.txt", []byte("hello\n"), 0o644, 1001, 1001)
	b.file("big.bin", randomBytes(3<<20+123, 1), 0o600, 0, 0)
	b.sparse("sparse.img", 64<<20, map[int64][]byte{0: randomBytes(4096, 2), 32 << 20: randomBytes(8192, 3)})
	b.sparse("hole-first.img", 16<<20, map[int64][]byte{(16 << 20) - 4096: randomBytes(4096, 4)})
	b.sparse("all-hole.img", 8<<20, nil)
	b.file("setuid", []byte("#!/bin/sh\n"), 0o4755, 1000, 1000)
	b.file("setgid", []byte("#!/bin/sh\n"), 0o2750, 0, 1003)
	b.file("caps", []byte("\x7fELF"), 0o755, 0, 0)
	b.xattr("caps", "security.capability", fileCaps())
	b.xattr("notes.txt", "user.note", []byte("keep me"))
	b.xattr("big.bin", "user.blob", randomBytes(2048, 5))
	b.dir("a", 0o755, 1001, 1001)
	b.dir("a/b", 0o750, 1001, 1002)
	b.dir("a/b/c", 0o700, 1001, 1002)
	b.file("a/b/c/deep", []byte("deep\n"), 0o444, 1001, 1002)
	b.dir("sticky", 0o1777, 0, 0)
	b.dir("setgid-dir", 0o2775, 0, 1003)
	b.dir("locked", 0o000, 1005, 1005)
	b.file("locked/secret", []byte("only root reads this\n"), 0o600, 1005, 1005)
	b.dir("ro", 0o555, 0, 0)
	b.file("ro/inside", []byte("in a read-only directory\n"), 0o644, 0, 0)
	b.xattr("a", "user.dir", []byte("on a directory"))
	b.setfacl("-m", "u:1234:r,g:2345:rw", "notes.txt")
	b.setfacl("-m", "u:1234:rx", "a/b")
	b.setfacl("-d", "-m", "u:1234:rwx,g::r-x", "a/b")
	b.check(os.Link(b.path("small.txt"), b.path("a/hard1")))
	b.check(os.Link(b.path("small.txt"), b.path("a/b/hard2")))
	b.symlink("small.txt", "rel-link", 1001, 1002)
	b.symlink("/etc/passwd", "abs-link", 0, 0)
	b.symlink("nowhere/at/all", "dangling", 0, 0)
	b.symlink("a", "dir-link", 0, 0)
	b.symlink("../../small.txt", "a/b/up-link", 1001, 1001)
	b.mknod("fifo", unix.S_IFIFO|0o620, 0, 1001, 1002)
	b.mknod("sock", unix.S_IFSOCK|0o755, 0, 0, 0)
	if blockDev != 0 {
		b.mknod("blockdev", unix.S_IFBLK|0o660, blockDev, 0, 6)
	}
	// Times last, deepest first, as a restore would.
	for _, rel := range []string{"empty", "notes.txt", "small.txt", "big.bin", "sparse.img", "hole-first.img", "setuid",
		"setgid", "caps", "a/b/c/deep", "locked/secret", "ro/inside", "rel-link", "abs-link", "dangling", "fifo", "sock",
		"a/b/up-link", "a/b/c", "a/b", "a", "sticky", "setgid-dir", "locked", "ro", "."} {
		b.times(rel, unix.Timespec{Sec: past.Sec + int64(len(rel)), Nsec: past.Nsec})
	}
}

// describe lists a tree the way an operator would check it by hand: find's type, mode, owner,
// group, link count, link target and modification time of every entry, each regular file's size
// and SHA-256, device numbers, getfacl and getfattr of everything, and find -links' hard-link
// groups. skip names top-level entries to leave out (lost+found on a new ext4).
func describe(t *testing.T, root string, skip ...string) string {
	t.Helper()
	getfacl := need.Command(t, "getfacl", "make test-deps installs acl")
	getfattr := need.Command(t, "getfattr", "make test-deps installs attr")
	run := func(name string, args ...string) string {
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, errb.String())
		}
		return out.String()
	}
	prune := []string{"."}
	for _, s := range skip {
		prune = append(prune, "-path", "./"+s, "-prune", "-o")
	}
	find := func(args ...string) string {
		all := append(slices.Clone(prune), args...)
		lines := strings.Split(strings.TrimRight(run("find", all...), "\n"), "\n")
		slices.Sort(lines)
		return strings.Join(lines, "\n")
	}
	var parts []string
	parts = append(parts,
		"entries:\n"+find("-printf", "%p %y %m %U %G %T@ %l\n"),
		"link counts:\n"+find("!", "-type", "d", "-printf", "%p %n\n"),
		"sizes:\n"+find("-type", "f", "-printf", "%p %s\n"),
		"contents:\n"+find("-type", "f", "-exec", "sha256sum", "{}", "+"),
		"devices:\n"+find("(", "-type", "b", "-o", "-type", "c", ")", "-exec", "stat", "-c", "%n %t:%T", "{}", "+"),
		"acls:\n"+paragraphs(run(getfacl, "-R", "-P", "-n", "-p", ".")),
		"xattrs:\n"+paragraphs(run(getfattr, "-R", "-P", "-h", "-d", "-m", "-", "-e", "hex", ".")),
		"hard links:\n"+hardLinkGroups(find("-type", "f", "-links", "+1", "-printf", "%i %p\n")))
	out := strings.Join(parts, "\n\n")
	for _, s := range skip { // getfacl and getfattr have no prune
		out = dropPath(out, "./"+s)
	}
	return out
}

// hardLinkGroups turns find's "inode path" lines into the groups of paths sharing an inode, which
// compare across filesystems.
func hardLinkGroups(lines string) string {
	groups := map[string][]string{}
	for l := range strings.SplitSeq(lines, "\n") {
		if ino, p, ok := strings.Cut(l, " "); ok {
			groups[ino] = append(groups[ino], p)
		}
	}
	var out []string
	for _, g := range groups {
		slices.Sort(g)
		out = append(out, strings.Join(g, " = "))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// paragraphs sorts getfacl's or getfattr's paragraphs, which follow the directories' order.
func paragraphs(s string) string {
	ps := strings.Split(strings.TrimSpace(s), "\n\n")
	slices.Sort(ps)
	return strings.Join(ps, "\n\n")
}

// dropPath removes getfacl's and getfattr's paragraphs about path.
func dropPath(s, path string) string {
	var keep []string
	for p := range strings.SplitSeq(s, "\n\n") {
		if !strings.HasPrefix(p, "# file: "+path) {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, "\n\n")
}

// blocks is a file's allocated bytes.
func blocks(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

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
