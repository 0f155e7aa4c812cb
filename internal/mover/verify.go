package mover

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// verifier compares a copy with its original.
type verifier struct {
	*run
	src, dst string

	mu    sync.Mutex
	diffs []Difference // the first MaxDifferences by path
	count int64
	links []linked        // regular files with more than one name on either side
	seen  map[inode]inode // the original's hard-linked files already compared, and their copies
}

// linked is a regular file with more than one name, and its inode on each side.
type linked struct {
	rel       string
	src, copy inode
}

// Verify compares the tree dst with the original src: every entry's type, size, owner, group,
// mode, device number, modification time, symlink target, extended attributes (POSIX ACLs
// included) and hard-link structure, and a regular file's SHA-256 on each side. The result is
// Done when they are the same, Differ with the differences otherwise, and Failed when an entry
// could not be read.
func Verify(ctx context.Context, src, dst string, o Options) *Report {
	start := time.Now()
	if o.MaxDifferences <= 0 {
		o.MaxDifferences = DefaultMaxDifferences
	}
	v := &verifier{run: newRun(ctx, o), src: src, dst: dst, seen: map[inode]inode{}}
	rep := &Report{Format: ReportFormat, Op: OpVerify, Source: src, Target: dst}
	s, err := rootDir("original", src)
	if err == nil {
		var d unix.Stat_t
		if d, err = rootDir("copy", dst); err == nil {
			err = separate(src, dst, &s, &d)
		}
	}
	if err == nil {
		v.pool.submit(func() { v.compare(".", src, dst) })
		v.work(OpVerify)
		err = v.firstErr()
	}
	if err == nil {
		v.checkLinks()
		rep.Differences, rep.DifferenceCount = v.diffs, v.count
		if v.count > 0 {
			rep.Result = Differ
		}
	}
	return v.finish(rep, start, err)
}

// differ records a difference, keeping the first MaxDifferences by path so that the list is the
// same however the work was scheduled.
func (v *verifier) differ(d Difference) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.count++
	i, _ := slices.BinarySearchFunc(v.diffs, d, compareDiffs)
	if i >= v.opts.MaxDifferences {
		return
	}
	v.diffs = slices.Insert(v.diffs, i, d)
	if len(v.diffs) > v.opts.MaxDifferences {
		v.diffs = v.diffs[:v.opts.MaxDifferences]
	}
}

func compareDiffs(a, b Difference) int {
	if c := strings.Compare(a.Path, b.Path); c != 0 {
		return c
	}
	return strings.Compare(a.Attribute, b.Attribute)
}

func (v *verifier) changed(rel, attr, orig, copy string) {
	v.differ(Difference{Path: rel, Kind: Changed, Attribute: attr, Original: orig, Copy: copy})
}

// compare compares the entry rel, which both trees hold, and walks on into it when it is a
// directory on both sides.
func (v *verifier) compare(rel, src, dst string) {
	if v.stopped() {
		return
	}
	s, err := lstat(src)
	var d unix.Stat_t
	if err == nil {
		d, err = lstat(dst)
	}
	if err == nil {
		err = v.entry(rel, src, dst, &s, &d)
	}
	if err != nil {
		v.fail(err)
		return
	}
	if isType(&s, unix.S_IFDIR) && isType(&d, unix.S_IFDIR) {
		v.pool.submit(func() { v.dir(rel, src, dst) })
	}
}

// entry compares one entry's attributes and contents.
func (v *verifier) entry(rel, src, dst string, s, d *unix.Stat_t) error {
	if s.Mode&unix.S_IFMT != d.Mode&unix.S_IFMT {
		v.changed(rel, "type", typeName(s.Mode), typeName(d.Mode))
		return nil
	}
	first, compared := true, false
	if isType(s, unix.S_IFREG) && (s.Nlink > 1 || d.Nlink > 1) {
		v.mu.Lock()
		v.links = append(v.links, linked{rel: rel, src: inodeOf(s), copy: inodeOf(d)})
		c, seen := v.seen[inodeOf(s)]
		first, compared = !seen, seen && c == inodeOf(d)
		if !seen {
			v.seen[inodeOf(s)] = inodeOf(d)
		}
		v.mu.Unlock()
	}
	v.counts.count(s, first)
	if s.Uid != d.Uid {
		v.changed(rel, "owner", strconv.Itoa(int(s.Uid)), strconv.Itoa(int(d.Uid)))
	}
	if s.Gid != d.Gid {
		v.changed(rel, "group", strconv.Itoa(int(s.Gid)), strconv.Itoa(int(d.Gid)))
	}
	if !isType(s, unix.S_IFLNK) && s.Mode&permBits != d.Mode&permBits {
		v.changed(rel, "mode", formatMode(s.Mode), formatMode(d.Mode))
	}
	if s.Mtim != d.Mtim {
		v.changed(rel, "mtime", formatTime(s.Mtim), formatTime(d.Mtim))
	}
	if err := v.xattrs(rel, src, dst); err != nil {
		return err
	}
	switch s.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if s.Size != d.Size {
			v.changed(rel, "size", strconv.FormatInt(s.Size, 10), strconv.FormatInt(d.Size, 10))
			return nil
		}
		if compared { // another name of a file whose data was compared
			return nil
		}
		if s.Size <= inlineSize {
			return v.content(rel, src, dst, s.Size)
		}
		size := s.Size
		v.pool.submit(func() {
			if v.stopped() {
				return
			}
			if err := v.content(rel, src, dst, size); err != nil {
				v.fail(err)
			}
		})
	case unix.S_IFLNK:
		ts, err1 := os.Readlink(src)
		td, err2 := os.Readlink(dst)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if ts != td {
			v.changed(rel, "target", ts, td)
		}
	case unix.S_IFBLK, unix.S_IFCHR:
		if s.Rdev != d.Rdev {
			v.changed(rel, "device", formatDev(s.Rdev), formatDev(d.Rdev))
		}
	}
	return nil
}

// content compares the SHA-256 of two regular files of size bytes.
func (v *verifier) content(rel, src, dst string, size int64) error {
	hs, err := hashFile(src, size)
	if err != nil {
		return err
	}
	hd, err := hashFile(dst, size)
	if err != nil {
		return err
	}
	if hs != hd {
		v.changed(rel, "content", "sha256 "+hs, "sha256 "+hd)
	}
	return nil
}

// xattrs compares the extended attributes of src and dst.
func (v *verifier) xattrs(rel, src, dst string) error {
	xs, err := listXattrs(src)
	if err != nil {
		return err
	}
	xd, err := listXattrs(dst)
	if err != nil {
		return err
	}
	i, j := 0, 0
	for i < len(xs) || j < len(xd) {
		switch {
		case j == len(xd) || i < len(xs) && xs[i].name < xd[j].name:
			v.changed(rel, "xattr "+xs[i].name, showXattr(xs[i]), "")
			i++
		case i == len(xs) || xd[j].name < xs[i].name:
			v.changed(rel, "xattr "+xd[j].name, "", showXattr(xd[j]))
			j++
		default:
			if !bytes.Equal(xs[i].value, xd[j].value) {
				v.changed(rel, "xattr "+xs[i].name, showXattr(xs[i]), showXattr(xd[j]))
			}
			i, j = i+1, j+1
		}
	}
	return nil
}

// dir compares the entries of a directory both trees hold: an entry on one side only is missing or
// extra, and each entry on both is compared here, but for a directory, walked in a job of its
// own, and a large file's contents.
func (v *verifier) dir(rel, src, dst string) {
	ns, err := readNames(src)
	if err != nil {
		v.fail(pathErr("read the directory", src, unwrapPath(err)))
		return
	}
	nd, err := readNames(dst)
	if err != nil {
		v.fail(pathErr("read the directory", dst, unwrapPath(err)))
		return
	}
	i, j := 0, 0
	for i < len(ns) || j < len(nd) {
		switch {
		case j == len(nd) || i < len(ns) && ns[i] < nd[j]:
			v.oneSide(joinRel(rel, ns[i]), filepath.Join(src, ns[i]), Missing)
			i++
		case i == len(ns) || nd[j] < ns[i]:
			if !(rel == "." && nd[j] == lostFound && emptyDir(filepath.Join(dst, nd[j]))) {
				v.oneSide(joinRel(rel, nd[j]), filepath.Join(dst, nd[j]), Extra)
			}
			j++
		default:
			v.compare(joinRel(rel, ns[i]), filepath.Join(src, ns[i]), filepath.Join(dst, nd[j]))
			i, j = i+1, j+1
		}
	}
}

// oneSide records an entry only one tree holds.
func (v *verifier) oneSide(rel, path string, kind Kind) {
	st, err := lstat(path)
	if err != nil {
		v.fail(err)
		return
	}
	d := Difference{Path: rel, Kind: kind}
	if kind == Missing {
		d.Original = typeName(st.Mode)
	} else {
		d.Copy = typeName(st.Mode)
	}
	v.differ(d)
}

func emptyDir(path string) bool {
	names, err := readNames(path)
	return err == nil && len(names) == 0
}

// checkLinks compares the hard-link structure: names that share one file in the original share
// one in the copy, and no others do.
func (v *verifier) checkLinks() {
	slices.SortFunc(v.links, func(a, b linked) int { return strings.Compare(a.rel, b.rel) })
	bySrc, byCopy := map[inode]string{}, map[inode]string{}
	for _, l := range v.links {
		first, seen := bySrc[l.src]
		if !seen {
			bySrc[l.src] = l.rel
		}
		other, copySeen := byCopy[l.copy]
		if !copySeen {
			byCopy[l.copy] = l.rel
		}
		switch {
		case seen && (!copySeen || other != first):
			v.changed(l.rel, "hard link", "the same file as "+first, "a separate file")
		case copySeen && (!seen || first != other):
			v.changed(l.rel, "hard link", "a separate file", "the same file as "+other)
		}
	}
}

// hashFile is the SHA-256 of the size bytes of a regular file's contents, in hex. A file that
// ends before size fails. A large file is read with direct I/O where its filesystem takes it: from
// the disk, whatever the page cache holds, and without copying each page.
func hashFile(path string, size int64) (string, error) {
	fd, err := openRead(path)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	if size >= directSize && setDirect(fd, true) == nil {
		sum, err := hashDirect(fd, path, size)
		if !errors.Is(err, errNoDirect) {
			return sum, err
		}
		if err := setDirect(fd, false); err != nil {
			return "", pathErr("stop direct I/O on", path, err)
		}
	}
	h := sha256.New()
	buf := getBuffer()
	defer putBuffer(buf)
	for off := int64(0); off < size; {
		n, err := unix.Pread(fd, (*buf)[:min(size-off, int64(len(*buf)))], off)
		if err != nil {
			return "", pathErr("read", path, err)
		}
		if n == 0 {
			return "", fmt.Errorf("%s: ended before its size while being read (is something writing to it?)", path)
		}
		h.Write((*buf)[:n])
		off += int64(n)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashDirect is hashFile through direct I/O, in whole blocks.
func hashDirect(fd int, path string, size int64) (string, error) {
	h := sha256.New()
	buf := getDirectBuffer()
	defer putDirectBuffer(buf)
	for off := int64(0); off < size; {
		want := min(size-off, int64(len(*buf)))
		n, err := unix.Pread(fd, (*buf)[:alignUp(want)], off)
		if errors.Is(err, unix.EINVAL) {
			return "", errNoDirect
		}
		if err != nil {
			return "", pathErr("read", path, err)
		}
		if int64(n) < want {
			return "", fmt.Errorf("%s: ended before its size while being read (is something writing to it?)", path)
		}
		h.Write((*buf)[:want])
		off += want
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// showXattr is an attribute's value as a difference shows it: a POSIX ACL as its entries, text as
// itself, anything else as its size and SHA-256.
func showXattr(x xattr) string {
	if acl, ok := showACL(x); ok {
		return acl
	}
	if len(x.value) <= 64 && utf8.Valid(x.value) && !bytes.ContainsFunc(x.value, func(r rune) bool { return r < ' ' && r != 0 }) {
		return strconv.Quote(string(x.value))
	}
	sum := sha256.Sum256(x.value)
	return fmt.Sprintf("%d bytes, sha256 %s", len(x.value), hex.EncodeToString(sum[:8]))
}

// showACL decodes a system.posix_acl_access or _default value (version 2: entries of a 16-bit
// tag, 16-bit permissions and 32-bit id) into getfacl's short form.
func showACL(x xattr) (string, bool) {
	if x.name != "system.posix_acl_access" && x.name != "system.posix_acl_default" ||
		len(x.value) < 4 || (len(x.value)-4)%8 != 0 || binary.LittleEndian.Uint32(x.value) != 2 {
		return "", false
	}
	var parts []string
	for e := x.value[4:]; len(e) > 0; e = e[8:] {
		tag, perm, id := binary.LittleEndian.Uint16(e), binary.LittleEndian.Uint16(e[2:]), binary.LittleEndian.Uint32(e[4:])
		var who string
		switch tag {
		case 0x01:
			who = "user:"
		case 0x02:
			who = "user:" + strconv.FormatUint(uint64(id), 10)
		case 0x04:
			who = "group:"
		case 0x08:
			who = "group:" + strconv.FormatUint(uint64(id), 10)
		case 0x10:
			who = "mask:"
		case 0x20:
			who = "other:"
		default:
			return "", false
		}
		rwx := []byte("---")
		for k, c := range "rwx" {
			if perm&(4>>k) != 0 {
				rwx[k] = byte(c)
			}
		}
		parts = append(parts, who+":"+string(rwx))
	}
	return strings.Join(parts, ","), true
}
