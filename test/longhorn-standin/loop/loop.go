// Package loop attaches image files to loop devices and detaches them, for the lab's Longhorn
// stand-in. Loop devices belong to the kernel, shared by this machine and every lab host, so the
// only device nodes made here are /dev/loop-control (when a lab host's /dev lacks it) and the
// node of a loop device this package attached: a free number from LOOP_CTL_GET_FREE, whose
// node is removed when it is detached.
package loop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SysBlock lists the kernel's block devices: a bound loop device with its backing file.
const SysBlock = "/sys/block"

// controlPath is the loop driver's control device, c 10:237.
const controlPath = "/dev/loop-control"

// Device is an attached loop device. It stays attached while Device is open, and after Close
// only while something (a mount) holds it: it is attached with LO_FLAGS_AUTOCLEAR, so the kernel
// detaches it when its last user goes, even when the process that attached it is gone.
type Device struct {
	Number int
	Path   string // its node, /dev/loopN
	f      *os.File
}

// File is the open device, to read and write it.
func (d *Device) File() *os.File { return d.f }

// Close drops this process's hold on the device.
func (d *Device) Close() error { return d.f.Close() }

// Attach binds image to a free loop device, read-write, with LO_FLAGS_AUTOCLEAR.
func Attach(image string) (*Device, error) {
	if err := ensureControl(); err != nil {
		return nil, err
	}
	ctl, err := os.OpenFile(controlPath, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	// Another process (on this machine or a lab host) may take the free number first: then the
	// configure fails with EBUSY and the next free number is tried.
	for range 20 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		path, made, err := node(n)
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			removeNode(path, made)
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			f.Close()
			removeNode(path, made)
			continue
		}
		if err != nil {
			f.Close()
			removeNode(path, made)
			return nil, fmt.Errorf("attach %s to %s: %w", image, path, err)
		}
		return &Device{Number: n, Path: path, f: f}, nil
	}
	return nil, fmt.Errorf("attach %s: no free loop device after 20 tries", image)
}

// Open opens the node of loop device n, making it if missing; when Open made it, Close on the
// result leaves it, and Detach removes it.
func Open(n int) (*Device, error) {
	path, made, err := node(n)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		removeNode(path, made)
		return nil, err
	}
	return &Device{Number: n, Path: path, f: f}, nil
}

// Detach unbinds the device and closes it. Holding it open since it was opened, this process
// keeps anyone else from binding it meanwhile: what is unbound is this device's file. A device
// still mounted is only marked to detach when its last user goes (the kernel's lazy clear). Its
// node is removed unless /dev is the kernel's devtmpfs (whose nodes the kernel keeps).
func (d *Device) Detach() error {
	err := unix.IoctlSetInt(int(d.f.Fd()), unix.LOOP_CLR_FD, 0)
	if errors.Is(err, unix.ENXIO) { // not bound
		err = nil
	}
	return errors.Join(err, d.f.Close(), DropNode(d.Path))
}

// DropNode removes path, a loop device's node, from this process's /dev, unless /dev is the
// kernel's devtmpfs (whose nodes the kernel keeps): after Detach, or once nothing here mounts a
// device another host bound and detaches. A path that is no loop device's node is left alone.
func DropNode(path string) error {
	if !strings.HasPrefix(path, "/dev/loop") || devtmpfs() {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// BoundTo reports whether the device is bound to file: the same device and inode.
func (d *Device) BoundTo(file string) bool {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return false
	}
	info, err := unix.IoctlLoopGetStatus64(int(d.f.Fd()))
	return err == nil && info.Device == st.Dev && info.Inode == st.Ino
}

// devtmpfs reports whether this process's /dev is the kernel's devtmpfs, as on this machine,
// rather than a lab host's own tmpfs.
func devtmpfs() bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	fstype := ""
	for line := range strings.Lines(string(b)) {
		// mount ID, parent ID, major:minor, root, mount point, options, optional fields, "-",
		// filesystem type, …; a later mount over /dev hides an earlier one.
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == "/dev" {
			for i, x := range f {
				if x == "-" && i+1 < len(f) {
					fstype = f[i+1]
				}
			}
		}
	}
	return fstype == "devtmpfs"
}

// Backing lists the bound loop devices in sysBlock by number, each with its backing file as the
// reading process sees it (" (deleted)" dropped).
func Backing(sysBlock string) map[int]string {
	paths, _ := filepath.Glob(filepath.Join(sysBlock, "loop*", "loop", "backing_file"))
	out := map[int]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(filepath.Dir(p))), "loop"))
		if err != nil {
			continue
		}
		out[n] = strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	}
	return out
}

// Number is the number of the loop device whose node is path (/dev/loopN).
func Number(path string) (int, bool) {
	rest, ok := strings.CutPrefix(path, "/dev/loop")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

// Find returns the number of a loop device whose backing file has file's path, or -1; BoundTo
// tells whether it is file itself.
func Find(file string) int {
	for n, f := range Backing(SysBlock) {
		if f == file {
			return n
		}
	}
	return -1
}

// DetachFiles detaches every loop device bound to one of files, found by the backing file's
// device and inode (LOOP_GET_STATUS64): the path a device reports is the one its file had in the
// mount namespace that bound it, which for a lab host's device is not this machine's path to the
// file. It says which devices it detached.
func DetachFiles(files ...string) ([]string, error) {
	type id struct{ dev, ino uint64 }
	want := map[id]string{}
	bases := map[string]bool{}
	for _, f := range files {
		var st unix.Stat_t
		if err := unix.Stat(f, &st); err == nil {
			want[id{st.Dev, st.Ino}] = f
			bases[filepath.Base(f)] = true
		}
	}
	var detached []string
	var errs []error
	for n, f := range Backing(SysBlock) {
		if !bases[filepath.Base(f)] { // only devices whose file has one of the names are opened
			continue
		}
		d, err := Open(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(int(d.f.Fd()))
		file, ok := "", false
		if err == nil {
			file, ok = want[id{info.Device, info.Inode}]
		}
		if !ok { // another's device, or detached before it was opened
			errs = append(errs, d.Close())
			continue
		}
		detached = append(detached, fmt.Sprintf("%s (%s)", d.Path, file))
		errs = append(errs, d.Detach())
	}
	return detached, errors.Join(errs...)
}

// node returns the path of loop device n's node, making it (and reporting so) when missing from
// the /dev this process sees: a lab host's /dev is its own tmpfs.
func node(n int) (string, bool, error) {
	path := fmt.Sprintf("/dev/loop%d", n)
	b, err := os.ReadFile(filepath.Join(SysBlock, fmt.Sprintf("loop%d", n), "dev"))
	if err != nil {
		return "", false, fmt.Errorf("loop device %d: %w", n, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return "", false, fmt.Errorf("loop device %d: its dev %q: %w", n, b, err)
	}
	dev := unix.Mkdev(major, minor)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != dev {
			return "", false, fmt.Errorf("%s is not block device %d:%d", path, major, minor)
		}
		return path, false, nil
	}
	if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(dev)); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", false, fmt.Errorf("mknod %s: %w", path, err)
	}
	return path, true, nil
}

func removeNode(path string, made bool) {
	if made {
		os.Remove(path) //nolint:errcheck // a node this package made for a number it did not get
	}
}

// ensureControl makes /dev/loop-control (c 10:237) where missing.
func ensureControl() error {
	if _, err := os.Stat(controlPath); err == nil {
		return nil
	}
	err := unix.Mknod(controlPath, unix.S_IFCHR|0o600, int(unix.Mkdev(10, 237)))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mknod %s: %w", controlPath, err)
	}
	return nil
}
