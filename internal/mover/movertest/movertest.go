// Package movertest writes and describes trees on real filesystems for the data mover's tests
// (tmpfs, and ext4 on a loop device the test attaches itself), and builds its image.
package movertest

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

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"kipper.run/kip/internal/mover/moverimage"
	"kipper.run/kip/test/need"
	"kipper.run/kip/test/testenv"
)

// The tests' filesystems are real: tmpfs, and ext4 on a loop device the test attaches itself
// (mount -o loop). Every mount is nodev and nosuid, and the only device node a test creates is
// a block node of its own loop device.

// MountTmpfs mounts a tmpfs of size (e.g. "64m") at a new directory.
func MountTmpfs(t testing.TB, size string) string {
	t.Helper()
	need.Root(t)
	dir := t.TempDir()
	mount(t, "-t", "tmpfs", "-o", "nodev,nosuid,size="+size, "tmpfs", dir)
	return dir
}

// MountExt4 makes an ext4 filesystem of size in an image file and mounts it on its own loop
// device; it returns the mount and the loop device's number.
func MountExt4(t testing.TB, size string) (string, uint64) {
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

func mount(t testing.TB, args ...string) {
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
func Subdir(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	past    = unix.Timespec{Sec: 1577934245, Nsec: 123456789} // 2020-01-02T03:04:05.123456789Z
	Earlier = unix.Timespec{Sec: 1262304000, Nsec: 987654321}
)

// Builder writes a tree with every kind of entry a volume can hold.
type Builder struct {
	T    testing.TB
	Root string
}

func (b Builder) Path(rel string) string { return filepath.Join(b.Root, rel) }

func (b Builder) Check(err error) {
	b.T.Helper()
	if err != nil {
		b.T.Fatal(err)
	}
}

func (b Builder) File(rel string, data []byte, mode uint32, uid, gid int) {
	b.T.Helper()
	b.Check(os.WriteFile(b.Path(rel), data, 0o600))
	b.Own(rel, mode, uid, gid)
}

func (b Builder) Own(rel string, mode uint32, uid, gid int) {
	b.T.Helper()
	b.Check(os.Lchown(b.Path(rel), uid, gid))
	b.Check(unix.Fchmodat(unix.AT_FDCWD, b.Path(rel), mode, 0))
}

func (b Builder) Dir(rel string, mode uint32, uid, gid int) {
	b.T.Helper()
	b.Check(os.Mkdir(b.Path(rel), 0o700))
	b.Own(rel, mode, uid, gid)
}

// sparse writes a file of size whose data is only at the offsets given.
func (b Builder) Sparse(rel string, size int64, data map[int64][]byte) {
	b.T.Helper()
	f, err := os.OpenFile(b.Path(rel), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	b.Check(err)
	for off, d := range data {
		_, err := f.WriteAt(d, off)
		b.Check(err)
	}
	b.Check(f.Truncate(size))
	b.Check(f.Close())
}

func (b Builder) Symlink(target, rel string, uid, gid int) {
	b.T.Helper()
	b.Check(os.Symlink(target, b.Path(rel)))
	b.Check(os.Lchown(b.Path(rel), uid, gid))
}

func (b Builder) Mknod(rel string, mode uint32, dev uint64, uid, gid int) {
	b.T.Helper()
	b.Check(unix.Mknod(b.Path(rel), mode, int(dev)))
	b.Own(rel, mode&0o7777, uid, gid)
}

func (b Builder) Xattr(rel, name string, value []byte) {
	b.T.Helper()
	b.Check(unix.Lsetxattr(b.Path(rel), name, value, 0))
}

func (b Builder) Setfacl(args ...string) {
	b.T.Helper()
	tool := need.Command(b.T, "setfacl", "make test-deps installs acl")
	cmd := exec.Command(tool, args...)
	cmd.Dir = b.Root
	if out, err := cmd.CombinedOutput(); err != nil {
		b.T.Fatalf("setfacl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (b Builder) Times(rel string, ts unix.Timespec) {
	b.T.Helper()
	b.Check(unix.UtimesNanoAt(unix.AT_FDCWD, b.Path(rel), []unix.Timespec{Earlier, ts}, unix.AT_SYMLINK_NOFOLLOW))
}

// fileCaps is a security.capability value (VFS_CAP_REVISION_2, effective) granting
// CAP_NET_BIND_SERVICE.
func fileCaps() []byte {
	v := make([]byte, 20)
	binary.LittleEndian.PutUint32(v, 0x02000001)
	binary.LittleEndian.PutUint32(v[4:], 1<<10)
	return v
}

func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// MakeTree writes the test tree into root. blockDev, when not 0, is the test's own loop device, of
// which the tree gets a block node.
func MakeTree(t testing.TB, root string, blockDev uint64) {
	b := Builder{t, root}
	b.File("empty", nil, 0o644, 0, 0)
	b.File("notes.txt", []byte("notes\n"), 0o640, 1001, 1002)
	b.File("small.txt", []byte("hello\n"), 0o644, 1001, 1001)
	b.File("big.bin", RandomBytes(3<<20+123, 1), 0o600, 0, 0)
	b.Sparse("sparse.img", 64<<20, map[int64][]byte{0: RandomBytes(4096, 2), 32 << 20: RandomBytes(8192, 3)})
	b.Sparse("hole-first.img", 16<<20, map[int64][]byte{(16 << 20) - 4096: RandomBytes(4096, 4)})
	b.Sparse("all-hole.img", 8<<20, nil)
	b.File("setuid", []byte("#!/bin/sh\n"), 0o4755, 1000, 1000)
	b.File("setgid", []byte("#!/bin/sh\n"), 0o2750, 0, 1003)
	b.File("caps", []byte("\x7fELF"), 0o755, 0, 0)
	b.Xattr("caps", "security.capability", fileCaps())
	b.Xattr("notes.txt", "user.note", []byte("keep me"))
	b.Xattr("big.bin", "user.blob", RandomBytes(2048, 5))
	b.Dir("a", 0o755, 1001, 1001)
	b.Dir("a/b", 0o750, 1001, 1002)
	b.Dir("a/b/c", 0o700, 1001, 1002)
	b.File("a/b/c/deep", []byte("deep\n"), 0o444, 1001, 1002)
	b.Dir("sticky", 0o1777, 0, 0)
	b.Dir("setgid-dir", 0o2775, 0, 1003)
	b.Dir("locked", 0o000, 1005, 1005)
	b.File("locked/secret", []byte("only root reads this\n"), 0o600, 1005, 1005)
	b.Dir("ro", 0o555, 0, 0)
	b.File("ro/inside", []byte("in a read-only directory\n"), 0o644, 0, 0)
	b.Xattr("a", "user.dir", []byte("on a directory"))
	b.Setfacl("-m", "u:1234:r,g:2345:rw", "notes.txt")
	b.Setfacl("-m", "u:1234:rx", "a/b")
	b.Setfacl("-d", "-m", "u:1234:rwx,g::r-x", "a/b")
	b.Check(os.Link(b.Path("small.txt"), b.Path("a/hard1")))
	b.Check(os.Link(b.Path("small.txt"), b.Path("a/b/hard2")))
	b.Symlink("small.txt", "rel-link", 1001, 1002)
	b.Symlink("/etc/passwd", "abs-link", 0, 0)
	b.Symlink("nowhere/at/all", "dangling", 0, 0)
	b.Symlink("a", "dir-link", 0, 0)
	b.Symlink("../../small.txt", "a/b/up-link", 1001, 1001)
	b.Mknod("fifo", unix.S_IFIFO|0o620, 0, 1001, 1002)
	b.Mknod("sock", unix.S_IFSOCK|0o755, 0, 0, 0)
	if blockDev != 0 {
		b.Mknod("blockdev", unix.S_IFBLK|0o660, blockDev, 0, 6)
	}
	// Times last, deepest first, as a restore would.
	for _, rel := range []string{"empty", "notes.txt", "small.txt", "big.bin", "sparse.img", "hole-first.img", "setuid",
		"setgid", "caps", "a/b/c/deep", "locked/secret", "ro/inside", "rel-link", "abs-link", "dangling", "fifo", "sock",
		"a/b/up-link", "a/b/c", "a/b", "a", "sticky", "setgid-dir", "locked", "ro", "."} {
		b.Times(rel, unix.Timespec{Sec: past.Sec + int64(len(rel)), Nsec: past.Nsec})
	}
}

// describe lists a tree the way an operator would check it by hand: find's type, mode, owner,
// group, link count, link target and modification time of every entry, each regular file's size
// and SHA-256, device numbers, getfacl and getfattr of everything, and find -links' hard-link
// groups. skip names top-level entries to leave out (lost+found on a new ext4).
func Describe(t testing.TB, root string, skip ...string) string {
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
func Blocks(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// Image builds the mover's image from this checkout and fails t unless it is the pinned one.
func Image(ctx context.Context, t testing.TB) v1.ImageIndex {
	t.Helper()
	goCmd := need.Command(t, "go", "install Go")
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := moverimage.Build(ctx, goCmd, root)
	if err != nil {
		t.Fatal(err)
	}
	if err := moverimage.CheckPin(idx); err != nil {
		t.Fatal(err)
	}
	return idx
}
