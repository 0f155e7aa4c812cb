package mover

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// lstat stats path without following a symlink.
func lstat(path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	return st, pathErr("stat", path, err)
}

// pathErr names path and what was done in err; nil stays nil.
func pathErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// typeName names the type in mode, as a difference reports it.
func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("type %#o", mode&unix.S_IFMT)
}

func isType(st *unix.Stat_t, t uint32) bool { return st.Mode&unix.S_IFMT == t }

// permBits are the mode bits a copy keeps: permissions with setuid, setgid and sticky.
const permBits = 0o7777

// readNames lists a directory's entry names, sorted.
func readNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// xattr is one extended attribute (POSIX ACLs are the system.posix_acl_* ones).
type xattr struct {
	name  string
	value []byte
}

// listXattrs reads every extended attribute of path (not following a symlink), sorted by name. A
// filesystem without extended attributes has none.
func listXattrs(path string) ([]xattr, error) {
	return readXattrs(path, func(b []byte) (int, error) { return unix.Llistxattr(path, b) },
		func(name string, b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
}

// listXattrsFd reads every extended attribute of the open file fd, which is path.
func listXattrsFd(fd int, path string) ([]xattr, error) {
	return readXattrs(path, func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
		func(name string, b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
}

func readXattrs(path string, list func([]byte) (int, error), get func(string, []byte) (int, error)) ([]xattr, error) {
	var small [1024]byte
	buf := small[:]
	var n int
	for {
		var err error
		n, err = list(buf)
		if errors.Is(err, unix.ERANGE) {
			size, err := list(nil)
			if err != nil {
				return nil, pathErr("list extended attributes of", path, err)
			}
			buf = make([]byte, size+256)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, pathErr("list extended attributes of", path, err)
		}
		break
	}
	if n == 0 {
		return nil, nil
	}
	var out []xattr
	for name := range strings.SplitSeq(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00") {
		v, err := getXattr(name, get)
		if errors.Is(err, unix.ENODATA) { // removed between the list and the read
			continue
		}
		if err != nil {
			return nil, pathErr("read extended attribute "+name+" of", path, err)
		}
		out = append(out, xattr{name, v})
	}
	slices.SortFunc(out, func(a, b xattr) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

func getXattr(name string, get func(string, []byte) (int, error)) ([]byte, error) {
	var small [256]byte
	n, err := get(name, small[:])
	if err == nil {
		return slices.Clone(small[:n]), nil
	}
	if !errors.Is(err, unix.ERANGE) {
		return nil, err
	}
	size, err := get(name, nil)
	if err != nil {
		return nil, err
	}
	v := make([]byte, size)
	n, err = get(name, v)
	return v[:n], err
}

// setXattrs sets xs on path, not following a symlink.
func setXattrs(path string, xs []xattr) error {
	for _, x := range xs {
		if err := unix.Lsetxattr(path, x.name, x.value, 0); err != nil {
			return pathErr("set extended attribute "+x.name+" on", path, err)
		}
	}
	return nil
}

// setMeta gives path (a directory, symlink or special file) the owner, mode, extended attributes
// and times of st and xs, in the order that keeps each: the owner first (chown clears setuid and
// file capabilities), then the attributes, then the mode, then the times.
func setMeta(path string, st *unix.Stat_t, xs []xattr) error {
	if err := unix.Lchown(path, int(st.Uid), int(st.Gid)); err != nil {
		return pathErr("set the owner of", path, err)
	}
	if err := setXattrs(path, xs); err != nil {
		return err
	}
	if !isType(st, unix.S_IFLNK) { // a symlink's mode is always 0777
		if err := unix.Fchmodat(unix.AT_FDCWD, path, st.Mode&permBits, 0); err != nil {
			return pathErr("set the mode of", path, err)
		}
	}
	return setTimes(path, st)
}

// setTimes sets path's access and modification times to st's, not following a symlink.
func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return pathErr("set the times of", path, unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW))
}

// futimens sets the open file fd's access and modification times to st's (utimensat with a NULL
// path, which x/sys/unix does not wrap).
func futimens(fd int, path string, st *unix.Stat_t) error {
	ts := [2]unix.Timespec{st.Atim, st.Mtim}
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return pathErr("set the times of", path, e)
	}
	return nil
}

// formatTime is a time as a difference shows it.
func formatTime(ts unix.Timespec) string {
	return time.Unix(ts.Sec, ts.Nsec).UTC().Format(time.RFC3339Nano)
}

func formatMode(m uint32) string { return fmt.Sprintf("%04o", m&permBits) }

func formatDev(rdev uint64) string {
	return strconv.FormatUint(uint64(unix.Major(rdev)), 10) + ":" + strconv.FormatUint(uint64(unix.Minor(rdev)), 10)
}

// outOfSpace reports whether err is the target running out of room.
func outOfSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
