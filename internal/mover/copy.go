package mover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inlineSize is the largest file a directory's own job copies or compares, one after another;
// larger files are jobs of their own. Parallel work then spreads over directories (creating an
// entry takes its directory's lock) and a small file costs no job.
const inlineSize = 256 << 10

// copier copies one tree.
type copier struct {
	*run
	src, dst string

	mu    sync.Mutex
	first map[inode]string // a hard-linked file's first name, copied
	links []hardLink       // its other names, linked once every file is copied
	dirs  []dirMeta        // directories' metadata, set once their contents are in place

	noCopyRange atomic.Bool // copy_file_range does not work between these filesystems
	noDirect    atomic.Bool // direct I/O does not work between these filesystems
	umask       uint32      // the process's, which takes bits from a new file's mode
}

type hardLink struct{ rel, first string }

type dirMeta struct {
	rel string
	st  unix.Stat_t
	xs  []xattr
}

// Copy copies the tree at src into the directory dst, which must be empty but for an ext4
// lost+found (or is emptied first with o.Clean), and flushes the target's filesystem before it
// reports Done. An entry it cannot read or recreate fails the copy, naming the path; running out
// of room is OutOfSpace.
func Copy(ctx context.Context, src, dst string, o Options) *Report {
	start := time.Now()
	c := &copier{run: newRun(ctx, o), src: src, dst: dst, first: map[inode]string{}, umask: currentUmask()}
	rep := &Report{Format: ReportFormat, Op: OpCopy, Source: src, Target: dst}
	root, err := c.prepare()
	if err == nil {
		c.counts.count(&root, true)
		c.dirs = append(c.dirs, dirMeta{rel: ".", st: root})
		c.dirs[0].xs, err = listXattrs(src)
	}
	if err == nil {
		c.pool.submit(func() { c.walk(src, ".", c.entry) })
		c.work(OpCopy)
		err = c.firstErr()
	}
	if err == nil {
		err = c.linkAll()
	}
	if err == nil {
		err = c.finishDirs()
	}
	if err == nil {
		syncStart := time.Now()
		err = syncfs(dst)
		rep.SyncSeconds = time.Since(syncStart).Seconds()
	}
	return c.finish(rep, start, err)
}

// prepare checks the roots and empties the target when told to.
func (c *copier) prepare() (unix.Stat_t, error) {
	s, err := rootDir("source", c.src)
	if err != nil {
		return s, err
	}
	d, err := rootDir("target", c.dst)
	if err != nil {
		return s, err
	}
	if err := separate(c.src, c.dst, &s, &d); err != nil {
		return s, err
	}
	names, err := readNames(c.dst)
	if err != nil {
		return s, fmt.Errorf("the target %s: %w", c.dst, err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == lostFound })
	if len(names) > 0 && !c.opts.Clean {
		return s, fmt.Errorf("the target %s is not empty (it holds %s): a copy goes into an empty directory; pass --clean to empty it first",
			c.dst, strings.Join(names[:min(3, len(names))], ", "))
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(c.dst, n)); err != nil {
			return s, fmt.Errorf("empty the target: %w", err)
		}
	}
	// Until its own metadata is set last, the target's root must not hand a new entry a default
	// ACL or its group (setgid), as a root left by an earlier copy might; and it keeps none of
	// that copy's attributes (but its SELinux label, which the mount gives it).
	xs, err := listXattrs(c.dst)
	if err != nil {
		return s, err
	}
	for _, x := range xs {
		if x.name == "security.selinux" {
			continue
		}
		if err := unix.Lremovexattr(c.dst, x.name); err != nil && !errors.Is(err, unix.ENODATA) {
			return s, pathErr("remove extended attribute "+x.name+" of", c.dst, err)
		}
	}
	if err := unix.Chmod(c.dst, 0o700); err != nil {
		return s, pathErr("set the mode of", c.dst, err)
	}
	return s, nil
}

// entry copies one entry found by the walk; a directory is created here and walked next.
func (c *copier) entry(rel, path string, st *unix.Stat_t) (bool, error) {
	dst := filepath.Join(c.dst, rel)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		xs, err := listXattrs(path)
		if err != nil {
			return false, err
		}
		if err := unix.Mkdir(dst, 0o700); err != nil && !(rel == lostFound && errors.Is(err, unix.EEXIST)) {
			return false, pathErr("create the directory", dst, err)
		}
		c.counts.count(st, true)
		c.mu.Lock()
		c.dirs = append(c.dirs, dirMeta{rel: rel, st: *st, xs: xs})
		c.mu.Unlock()
		return true, nil
	case unix.S_IFREG:
		if st.Size <= inlineSize {
			return false, c.file(rel, path, dst, st)
		}
		st := *st
		c.pool.submit(func() {
			if c.stopped() {
				return
			}
			if err := c.file(rel, path, dst, &st); err != nil {
				c.fail(err)
			}
		})
		return false, nil
	case unix.S_IFLNK:
		target, err := os.Readlink(path)
		if err != nil {
			return false, err
		}
		if err := unix.Symlink(target, dst); err != nil {
			return false, pathErr("create the symlink", dst, err)
		}
	default: // device nodes, FIFOs and sockets
		if err := unix.Mknod(dst, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return false, pathErr("create the "+typeName(st.Mode), dst, err)
		}
	}
	xs, err := listXattrs(path)
	if err != nil {
		return false, err
	}
	c.counts.count(st, true)
	return false, setMeta(dst, st, xs)
}

// file copies a regular file, or notes it as a further name of a hard-linked file.
func (c *copier) file(rel, src, dst string, st *unix.Stat_t) error {
	if st.Nlink > 1 {
		c.mu.Lock()
		first, seen := c.first[inodeOf(st)]
		if seen {
			c.links = append(c.links, hardLink{rel: rel, first: first})
		} else {
			c.first[inodeOf(st)] = rel
		}
		c.mu.Unlock()
		if seen {
			c.counts.count(st, false)
			return nil
		}
	}
	in, err := openRead(src)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, st.Mode&0o777)
	if err != nil {
		return pathErr("create", dst, err)
	}
	err = c.data(in, out, src, dst, st)
	if err == nil {
		err = c.fileMeta(in, out, src, dst, st)
	}
	if cerr := unix.Close(out); err == nil && cerr != nil {
		err = pathErr("close", dst, cerr)
	}
	if err == nil {
		c.counts.count(st, true)
	}
	return err
}

// openRead opens a file to read it without changing its access time where the caller may.
func openRead(path string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK
	fd, err := unix.Open(path, flags|unix.O_NOATIME, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Open(path, flags, 0)
	}
	return fd, pathErr("open", path, err)
}

// data copies a file's contents, keeping its holes: only the ranges that hold data are copied,
// and the size is set after them. A large file is copied with direct I/O where both filesystems
// take it: the disk reads into and writes from kip's buffer, and no page is copied in memory
// (measured: the page cache's copying was most of a 2 GiB copy's time).
func (c *copier) data(in, out int, src, dst string, st *unix.Stat_t) error {
	if st.Size >= directSize && !c.noDirect.Load() && setDirect(in, true) == nil {
		if setDirect(out, true) == nil {
			err := c.ranges(in, out, src, dst, st, c.directRange, true)
			if !errors.Is(err, errNoDirect) {
				return err
			}
			c.noDirect.Store(true)
			if err := setDirect(out, false); err != nil {
				return pathErr("stop direct I/O on", dst, err)
			}
		}
		if err := setDirect(in, false); err != nil {
			return pathErr("stop direct I/O on", src, err)
		}
	}
	return c.ranges(in, out, src, dst, st, c.copyRange, false)
}

// ranges copies the ranges of in that hold data with copy, then sets the size when the copy may
// have left it short (a hole at the end) or long (direct I/O writes whole blocks).
func (c *copier) ranges(in, out int, src, dst string, st *unix.Stat_t, copy func(in, out int, off, n int64, src, dst string) error, direct bool) error {
	if st.Blocks*512 >= st.Size { // no room for a hole
		if err := copy(in, out, 0, st.Size, src, dst); err != nil || !direct {
			return err
		}
		return pathErr("set the size of", dst, unix.Ftruncate(out, st.Size))
	}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // only a hole is left
			break
		}
		if err != nil {
			return pathErr("find data in", src, err)
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return pathErr("find a hole in", src, err)
		}
		hole = min(hole, st.Size)
		if err := copy(in, out, data, hole-data, src, dst); err != nil {
			return err
		}
		off = hole
	}
	return pathErr("set the size of", dst, unix.Ftruncate(out, st.Size))
}

// directSize is the smallest file copied with direct I/O; directAlign the alignment of its
// offsets, lengths and buffer; directBuffer the most each read and write moves.
const (
	directSize   = 1 << 20
	directAlign  = 4096
	directBuffer = 4 << 20
)

// errNoDirect is direct I/O refused (EINVAL): the file is copied again through the page cache.
var errNoDirect = errors.New("direct I/O refused")

// setDirect turns O_DIRECT on or off for fd.
func setDirect(fd int, on bool) error {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if on {
		fl |= unix.O_DIRECT
	} else {
		fl &^= unix.O_DIRECT
	}
	_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl)
	return err
}

// directRange copies n bytes at off from in to out, both open with O_DIRECT, through an aligned
// buffer. Only a range that ends the file may end off a block: its last block is written whole,
// its tail zeroed, and ranges sets the size after.
func (c *copier) directRange(in, out int, off, n int64, src, dst string) error {
	if off%directAlign != 0 {
		return errNoDirect
	}
	buf := getDirectBuffer()
	defer putDirectBuffer(buf)
	for n > 0 {
		want := min(n, int64(len(*buf)))
		k, err := unix.Pread(in, (*buf)[:alignUp(want)], off)
		if errors.Is(err, unix.EINVAL) {
			return errNoDirect
		}
		if err != nil {
			return pathErr("read", src, err)
		}
		if int64(k) > want {
			k = int(want)
		}
		if int64(k) < want { // direct reads end short only at the end of the file
			return fmt.Errorf("%s: ended before its size while being copied (is something still writing to it?)", src)
		}
		end := int(alignUp(int64(k)))
		clear((*buf)[k:end])
		for w := 0; w < end; {
			m, err := unix.Pwrite(out, (*buf)[w:end], off+int64(w))
			if errors.Is(err, unix.EINVAL) {
				return errNoDirect
			}
			if err != nil {
				return pathErr("write", dst, err)
			}
			w += m
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

func alignUp(n int64) int64 { return (n + directAlign - 1) &^ (directAlign - 1) }

var directBuffers = sync.Pool{New: func() any {
	b := make([]byte, directBuffer+directAlign)
	skip := directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)
	b = b[skip%directAlign:][:directBuffer]
	return &b
}}

func getDirectBuffer() *[]byte  { return directBuffers.Get().(*[]byte) }
func putDirectBuffer(b *[]byte) { directBuffers.Put(b) }

// copyRange copies n bytes at off from in to out: in the kernel with copy_file_range where the two
// filesystems allow it, otherwise through a buffer.
func (c *copier) copyRange(in, out int, off, n int64, src, dst string) error {
	for n > 0 && !c.noCopyRange.Load() {
		roff, woff := off, off
		k, err := unix.CopyFileRange(in, &roff, out, &woff, int(min(n, 1<<30)), 0)
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
			c.noCopyRange.Store(true)
			break
		}
		if err != nil {
			return fmt.Errorf("copy %s to %s: %w", src, dst, err)
		}
		if k == 0 {
			return fmt.Errorf("%s: ended before its size while being copied (is something still writing to it?)", src)
		}
		off, n = off+int64(k), n-int64(k)
	}
	if n == 0 {
		return nil
	}
	buf := getBuffer()
	defer putBuffer(buf)
	for n > 0 {
		k, err := unix.Pread(in, (*buf)[:min(n, int64(len(*buf)))], off)
		if err != nil {
			return pathErr("read", src, err)
		}
		if k == 0 {
			return fmt.Errorf("%s: ended before its size while being copied (is something still writing to it?)", src)
		}
		for w := 0; w < k; {
			m, err := unix.Pwrite(out, (*buf)[w:k], off+int64(w))
			if err != nil {
				return pathErr("write", dst, err)
			}
			w += m
		}
		off, n = off+int64(k), n-int64(k)
	}
	return nil
}

// fileMeta gives the open copy out of in (src) the owner, extended attributes, mode and times of
// st. The file was created with st's permissions (no directory it is created in has a default ACL
// or setgid yet: prepare and finishDirs see to it), so its mode is set again only when the umask
// took some, or when it has setuid, setgid or sticky, which chown clears.
func (c *copier) fileMeta(in, out int, src, dst string, st *unix.Stat_t) error {
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return pathErr("set the owner of", dst, err)
	}
	xs, err := listXattrsFd(in, src)
	if err != nil {
		return err
	}
	for _, x := range xs {
		if err := unix.Fsetxattr(out, x.name, x.value, 0); err != nil {
			return pathErr("set extended attribute "+x.name+" on", dst, err)
		}
	}
	if st.Mode&0o777&^c.umask != st.Mode&permBits {
		if err := unix.Fchmod(out, st.Mode&permBits); err != nil {
			return pathErr("set the mode of", dst, err)
		}
	}
	return futimens(out, dst, st)
}

// linkAll makes the further names of hard-linked files, now that every file is copied.
func (c *copier) linkAll() error {
	for _, l := range c.links {
		if err := os.Link(filepath.Join(c.dst, l.first), filepath.Join(c.dst, l.rel)); err != nil {
			return err
		}
	}
	return nil
}

// finishDirs sets the directories' owner, attributes, mode and times, deepest first: after their
// contents, so that nothing created in them changes their times again.
func (c *copier) finishDirs() error {
	slices.SortFunc(c.dirs, func(a, b dirMeta) int { return depth(b.rel) - depth(a.rel) })
	for _, d := range c.dirs {
		if err := setMeta(filepath.Join(c.dst, d.rel), &d.st, d.xs); err != nil {
			return err
		}
	}
	return nil
}

// currentUmask reads the process's umask, which can only be read by setting it.
func currentUmask() uint32 {
	m := unix.Umask(0)
	unix.Umask(m)
	return uint32(m)
}

// depth is how deep rel is below the root, which is shallowest.
func depth(rel string) int {
	if rel == "." {
		return -1
	}
	return strings.Count(rel, "/")
}

// syncfs flushes the filesystem holding dir to its disk.
func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", dir, err)
	}
	defer unix.Close(fd)
	return pathErr("flush the filesystem of", dir, unix.Syncfs(fd))
}

var buffers = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func getBuffer() *[]byte  { return buffers.Get().(*[]byte) }
func putBuffer(b *[]byte) { buffers.Put(b) }
