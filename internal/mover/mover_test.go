package mover_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"kipper.run/kip/internal/mover"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/test/need"
)

// helperEnv makes the test binary run the mover's Copy itself (TestMain), with the capabilities
// the test gave it and without the mover's capability check: what a copier that skips would do.
const helperEnv = "KIP_MOVER_TEST_COPY"

func TestMain(m *testing.M) {
	if args := os.Getenv(helperEnv); args != "" {
		src, dst, _ := strings.Cut(args, "\n")
		rep := mover.Copy(context.Background(), src, dst, mover.Options{})
		os.Stdout.Write(append(rep.Line(), '\n'))
		os.Exit(rep.Result.ExitCode())
	}
	os.Exit(m.Run())
}

func TestCopyKeepsEveryEntry(t *testing.T) {
	cases := []struct {
		name string
		fs   func(t *testing.T) (src, dst string, dev uint64)
	}{
		{"ext4", func(t *testing.T) (string, string, uint64) {
			src, dev := movertest.MountExt4(t, "256m")
			dst, _ := movertest.MountExt4(t, "256m")
			return src, dst, dev
		}},
		{"tmpfs", func(t *testing.T) (string, string, uint64) {
			return movertest.MountTmpfs(t, "256m"), movertest.MountTmpfs(t, "256m"), 0
		}},
		// Across filesystem types copy_file_range does not work, and the copy goes through a buffer.
		{"ext4 to tmpfs", func(t *testing.T) (string, string, uint64) {
			src, dev := movertest.MountExt4(t, "256m")
			return src, movertest.MountTmpfs(t, "256m"), dev
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, dev := tc.fs(t)
			movertest.MakeTree(t, src, dev)
			rep := copyTree(t, src, dst, mover.Options{})
			if rep.Result != mover.Done {
				t.Fatalf("copy: %s: %s", rep.Result, rep.Error)
			}
			want, got := movertest.Describe(t, src), movertest.Describe(t, dst)
			if _, err := os.Lstat(filepath.Join(src, "lost+found")); err != nil { // a tmpfs source
				got = movertest.Describe(t, dst, "lost+found")
			}
			if want != got {
				t.Errorf("the copy differs from the original:\n--- original\n%s\n--- copy\n%s", want, got)
			}
			for _, f := range []string{"sparse.img", "hole-first.img", "all-hole.img"} {
				if s, d := movertest.Blocks(t, filepath.Join(src, f)), movertest.Blocks(t, filepath.Join(dst, f)); d > s+64<<10 {
					t.Errorf("%s: the copy allocates %d bytes, the original %d: its holes were filled", f, d, s)
				}
			}
			wantTotals := mover.Totals{Files: 15, Directories: 8, Symlinks: 5, Special: 2, HardLinks: 2,
				Bytes: 6 + 6 + 3<<20 + 123 + 64<<20 + 16<<20 + 8<<20 + 10 + 10 + 4 + 5 + 21 + 25}
			if dev != 0 {
				wantTotals.Special++
				wantTotals.Directories++ // the source's lost+found
			}
			if rep.Totals != wantTotals {
				t.Errorf("copy totals %+v, want %+v", rep.Totals, wantTotals)
			}
			if v := verifyTree(t, src, dst); v.Result != mover.Done || v.DifferenceCount != 0 || v.Totals != wantTotals {
				t.Errorf("verify of the copy: %s, %d differences %v, totals %+v: %s", v.Result, v.DifferenceCount, v.Differences, v.Totals, v.Error)
			}
			if s := scan(t, src); s.Result != mover.Done || s.Totals != wantTotals {
				t.Errorf("scan: %s, totals %+v, want %+v", s.Result, s.Totals, wantTotals)
			}
		})
	}
}

// mutation changes the copy in one way; want is the one difference verify must name.
type mutation struct {
	name   string
	change func(b movertest.Builder)
	want   mover.Difference
}

func TestVerifyNamesEachDifference(t *testing.T) {
	fs := movertest.MountTmpfs(t, "1g")
	src := movertest.Subdir(t, fs, "original")
	movertest.MakeTree(t, src, 0)
	changed := func(path, attr string) mover.Difference {
		return mover.Difference{Path: path, Kind: mover.Changed, Attribute: attr}
	}
	cases := []mutation{
		{"flipped byte", func(b movertest.Builder) {
			f, err := os.OpenFile(b.Path("big.bin"), os.O_RDWR, 0)
			b.Check(err)
			one := make([]byte, 1)
			_, err = f.ReadAt(one, 1<<20)
			b.Check(err)
			one[0] ^= 0x01
			_, err = f.WriteAt(one, 1<<20)
			b.Check(err)
			b.Check(f.Close())
		}, changed("big.bin", "content")},
		{"truncated file", func(b movertest.Builder) { b.Check(os.Truncate(b.Path("notes.txt"), 3)) }, changed("notes.txt", "size")},
		{"extended file", func(b movertest.Builder) {
			f, err := os.OpenFile(b.Path("notes.txt"), os.O_APPEND|os.O_WRONLY, 0)
			b.Check(err)
			_, err = f.WriteString("more\n")
			b.Check(err)
			b.Check(f.Close())
		}, changed("notes.txt", "size")},
		{"mode", func(b movertest.Builder) { b.Check(os.Chmod(b.Path("setuid"), 0o755)) }, changed("setuid", "mode")},
		{"sticky bit", func(b movertest.Builder) { b.Check(os.Chmod(b.Path("sticky"), 0o777)) }, changed("sticky", "mode")},
		{"owner", func(b movertest.Builder) { b.Check(os.Lchown(b.Path("a/b/c/deep"), 1009, -1)) }, changed("a/b/c/deep", "owner")},
		{"group", func(b movertest.Builder) { b.Check(os.Lchown(b.Path("rel-link"), -1, 1009)) }, changed("rel-link", "group")},
		{"xattr", func(b movertest.Builder) { b.Xattr("notes.txt", "user.note", []byte("changed")) }, changed("notes.txt", "xattr user.note")},
		{"xattr removed", func(b movertest.Builder) { b.Check(unix.Lremovexattr(b.Path("a"), "user.dir")) }, changed("a", "xattr user.dir")},
		{"file capabilities", func(b movertest.Builder) { b.Check(unix.Lremovexattr(b.Path("caps"), "security.capability")) },
			changed("caps", "xattr security.capability")},
		{"ACL", func(b movertest.Builder) { b.Setfacl("-m", "u:1234:rw", "notes.txt") }, changed("notes.txt", "xattr system.posix_acl_access")},
		{"default ACL", func(b movertest.Builder) { b.Setfacl("-k", "a/b") }, changed("a/b", "xattr system.posix_acl_default")},
		{"mtime", func(b movertest.Builder) { b.Times("empty", movertest.Earlier) }, changed("empty", "mtime")},
		{"symlink target", func(b movertest.Builder) {
			b.Check(os.Remove(b.Path("rel-link")))
			b.Symlink("notes.txt", "rel-link", 1001, 1002)
		}, changed("rel-link", "target")},
		{"broken hard link", func(b movertest.Builder) {
			b.Check(os.Remove(b.Path("a/hard1")))
			b.File("a/hard1", []byte("hello\n"), 0o644, 1001, 1001)
		}, changed("a/hard1", "hard link")},
		{"missing file", func(b movertest.Builder) { b.Check(os.Remove(b.Path("a/b/c/deep"))) },
			mover.Difference{Path: "a/b/c/deep", Kind: mover.Missing, Original: "regular file"}},
		{"extra file", func(b movertest.Builder) { b.File("a/extra", []byte("x"), 0o644, 0, 0) },
			mover.Difference{Path: "a/extra", Kind: mover.Extra, Copy: "regular file"}},
		{"file replaced by a directory", func(b movertest.Builder) {
			b.Check(os.Remove(b.Path("notes.txt")))
			b.Dir("notes.txt", 0o640, 1001, 1002)
		}, mover.Difference{Path: "notes.txt", Kind: mover.Changed, Attribute: "type", Original: "regular file", Copy: "directory"}},
		{"special file of another type", func(b movertest.Builder) {
			b.Check(os.Remove(b.Path("fifo")))
			b.Mknod("fifo", unix.S_IFSOCK|0o620, 0, 1001, 1002)
		}, mover.Difference{Path: "fifo", Kind: mover.Changed, Attribute: "type", Original: "FIFO", Copy: "socket"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := movertest.Subdir(t, fs, "copy-"+strings.Repeat("x", i))
			if rep := copyTree(t, src, dst, mover.Options{}); rep.Result != mover.Done {
				t.Fatalf("copy: %s: %s", rep.Result, rep.Error)
			}
			b := movertest.Builder{T: t, Root: dst}
			restore := keepTimes(t, dst, tc.want.Path, tc.want.Attribute != "mtime")
			tc.change(b)
			restore()
			rep := verifyTree(t, src, dst)
			if rep.Result != mover.Differ || rep.DifferenceCount != 1 || len(rep.Differences) != 1 {
				t.Fatalf("verify: %s with %d differences %v (%s), want exactly one: %v", rep.Result, rep.DifferenceCount, rep.Differences, rep.Error, tc.want)
			}
			got := rep.Differences[0]
			if got.Path != tc.want.Path || got.Kind != tc.want.Kind || got.Attribute != tc.want.Attribute ||
				tc.want.Original != "" && got.Original != tc.want.Original || tc.want.Copy != "" && got.Copy != tc.want.Copy {
				t.Errorf("verify found %+v, want %+v", got, tc.want)
			}
			if !strings.Contains(got.String(), tc.want.Path) {
				t.Errorf("the difference %q does not name the path", got)
			}
			if err := os.RemoveAll(dst); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// keepTimes returns a function that puts back the times of rel's directory and, with own, of rel
// (unless the change removes it), so that a mutation changes only what it means to.
func keepTimes(t *testing.T, root, rel string, own bool) func() {
	t.Helper()
	type saved struct {
		path string
		ts   []unix.Timespec
	}
	var keep []saved
	paths := []string{filepath.Dir(filepath.Join(root, rel))}
	if own {
		paths = append(paths, filepath.Join(root, rel))
	}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); os.IsNotExist(err) { // the change creates it
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, saved{p, []unix.Timespec{st.Atim, st.Mtim}})
	}
	return func() {
		for _, k := range keep {
			err := unix.UtimesNanoAt(unix.AT_FDCWD, k.path, k.ts, unix.AT_SYMLINK_NOFOLLOW)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
	}
}

func TestCopyOutOfSpace(t *testing.T) {
	src, dst := movertest.MountTmpfs(t, "16m"), movertest.MountTmpfs(t, "2m")
	b := movertest.Builder{T: t, Root: src}
	b.File("fits", []byte("small"), 0o644, 0, 0)
	b.File("too-big", movertest.RandomBytes(4<<20, 7), 0o644, 0, 0)
	var stdout, stderr bytes.Buffer
	code := mover.Main([]string{"copy", src, dst}, &stdout, &stderr)
	if code != mover.ExitOutOfSpace {
		t.Fatalf("exit code %d, want %d (out of space); log:\n%s%s", code, mover.ExitOutOfSpace, stderr.String(), stdout.String())
	}
	rep, err := mover.Decode(bytes.TrimSpace(stdout.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Result != mover.OutOfSpace || !strings.Contains(rep.Error, filepath.Join(dst, "too-big")) {
		t.Errorf("report: %s: %q, want out-of-space naming %s", rep.Result, rep.Error, filepath.Join(dst, "too-big"))
	}
}

func TestCopyTargetNotEmpty(t *testing.T) {
	fs := movertest.MountTmpfs(t, "16m")
	src, dst := movertest.Subdir(t, fs, "src"), movertest.Subdir(t, fs, "dst")
	movertest.Builder{T: t, Root: src}.File("new", []byte("new"), 0o644, 0, 0)
	movertest.Builder{T: t, Root: dst}.Dir("old", 0o500, 1001, 1001)
	movertest.Builder{T: t, Root: dst}.File("old/data", []byte("stale"), 0o400, 1001, 1001)
	rep := copyTree(t, src, dst, mover.Options{})
	if rep.Result != mover.Failed || !strings.Contains(rep.Error, "is not empty (it holds old)") || !strings.Contains(rep.Error, "--clean") {
		t.Fatalf("copy into a target holding old: %s: %q, want a refusal naming old and --clean", rep.Result, rep.Error)
	}
	if _, err := os.Stat(filepath.Join(dst, "old", "data")); err != nil {
		t.Fatalf("the refused copy touched the target: %v", err)
	}
	// The target's root as an earlier copy may leave it: setgid with another group and a default
	// ACL, which new entries would inherit.
	movertest.Builder{T: t, Root: dst}.Own(".", 0o2775, 0, 1003)
	movertest.Builder{T: t, Root: dst}.Setfacl("-d", "-m", "u:1234:rwx", ".")
	movertest.Builder{T: t, Root: dst}.Xattr(".", "user.left", []byte("by an earlier copy"))
	if rep := copyTree(t, src, dst, mover.Options{Clean: true}); rep.Result != mover.Done {
		t.Fatalf("copy --clean: %s: %s", rep.Result, rep.Error)
	}
	if v := verifyTree(t, src, dst); v.Result != mover.Done {
		t.Errorf("verify after copy --clean: %s %v", v.Result, v.Differences)
	}
	if rep := copyTree(t, src, filepath.Join(src), mover.Options{}); rep.Result != mover.Failed || !strings.Contains(rep.Error, "the same directory") {
		t.Errorf("copy onto itself: %s: %q", rep.Result, rep.Error)
	}
	inner := movertest.Subdir(t, src, "inner")
	if rep := copyTree(t, src, inner, mover.Options{}); rep.Result != mover.Failed || !strings.Contains(rep.Error, "one inside the other") {
		t.Errorf("copy into itself: %s: %q", rep.Result, rep.Error)
	}
}

// A copier without CAP_DAC_READ_SEARCH cannot read a 0700 directory of another user. The mover
// refuses to start without it; and were it running anyway, the unreadable directory fails the
// copy, naming it, rather than being skipped.
func TestCopyNeverSkipsUnreadable(t *testing.T) {
	setpriv := need.Command(t, "setpriv", "util-linux has it")
	fs := movertest.MountTmpfs(t, "16m")
	src, dst := movertest.Subdir(t, fs, "src"), movertest.Subdir(t, fs, "dst")
	b := movertest.Builder{T: t, Root: src}
	b.Dir("private", 0o700, 1005, 1005)
	b.File("private/db", []byte("data"), 0o600, 1005, 1005)
	without := []string{"--bounding-set=-dac_read_search,-dac_override", "--inh-caps=-all", "--"}

	cmd := exec.Command(setpriv, append(without, os.Args[0])...)
	cmd.Env = append(os.Environ(), helperEnv+"="+src+"\n"+dst)
	out, err := cmd.Output()
	rep, derr := mover.Decode(bytes.TrimSpace(out))
	if derr != nil {
		t.Fatalf("copy without DAC_READ_SEARCH: %v: %v: %s", err, derr, out)
	}
	if rep.Result != mover.Failed || !strings.Contains(rep.Error, filepath.Join(src, "private")) {
		t.Errorf("copy without DAC_READ_SEARCH: %s: %q, want a failure naming %s", rep.Result, rep.Error, filepath.Join(src, "private"))
	}

	bin := buildMover(t)
	cmd = exec.Command(setpriv, append(without, bin, "copy", "--clean", src, dst)...)
	out, err = cmd.CombinedOutput()
	if code := exitCode(err); code != mover.ExitError || !strings.Contains(string(out), "without the capabilities DAC_OVERRIDE, DAC_READ_SEARCH") {
		t.Errorf("kip-mover copy without DAC_READ_SEARCH: exit %d:\n%s", code, out)
	}
}

func TestMainReports(t *testing.T) {
	fs := movertest.MountTmpfs(t, "64m")
	src, dst := movertest.Subdir(t, fs, "src"), movertest.Subdir(t, fs, "dst")
	b := movertest.Builder{T: t, Root: src}
	for i := range 300 {
		b.File("file-"+strings.Repeat("n", i%7)+"-"+hex.EncodeToString([]byte{byte(i), byte(i >> 8)}), []byte{byte(i)}, 0o644, 0, 0)
	}
	term := filepath.Join(t.TempDir(), "termination-log")
	if err := os.WriteFile(term, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	runMain := func(args ...string) (int, []byte, *mover.Report) {
		var stdout, stderr bytes.Buffer
		code := mover.Main(append(args[:1:1], append([]string{"--termination-log", term}, args[1:]...)...), &stdout, &stderr)
		msg, err := os.ReadFile(term)
		if err != nil {
			t.Fatal(err)
		}
		if len(msg) >= mover.TerminationLimit {
			t.Fatalf("%s: termination message of %d bytes, over Kubernetes' %d", args[0], len(msg), mover.TerminationLimit)
		}
		short, err := mover.Decode(msg)
		if err != nil {
			t.Fatalf("%s: termination message: %v\n%s", args[0], err, msg)
		}
		log := append(stderr.Bytes(), stdout.Bytes()...)
		full, err := mover.FindFull(log, short.Digest)
		if err != nil {
			t.Fatalf("%s: %v", args[0], err)
		}
		sum := sha256.Sum256(bytes.TrimSpace(stdout.Bytes()))
		if short.Digest != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: digest %s is not the SHA-256 of the log's report", args[0], short.Digest)
		}
		return code, msg, full
	}

	if code, _, rep := runMain("copy", src, dst); code != mover.ExitDone || rep.Result != mover.Done || rep.Totals.Files != 300 {
		t.Fatalf("copy: exit %d, %s, %+v", code, rep.Result, rep.Totals)
	}
	if code, _, rep := runMain("scan", src); code != mover.ExitDone || rep.Totals.Files != 300 || rep.Totals.Directories != 1 {
		t.Errorf("scan: exit %d, %+v", code, rep.Totals)
	}
	for i := range 250 {
		movertest.Builder{T: t, Root: dst}.File("extra-"+strings.Repeat("e", 40)+hex.EncodeToString([]byte{byte(i)}), nil, 0o644, 0, 0)
	}
	code, msg, full := runMain("verify", src, dst)
	short, _ := mover.Decode(msg)
	switch {
	case code != mover.ExitDifferences || full.Result != mover.Differ:
		t.Errorf("verify: exit %d, %s, want %d, differences", code, full.Result, mover.ExitDifferences)
	case full.DifferenceCount != 251 || len(full.Differences) != mover.DefaultMaxDifferences: // 250 files and the root's mtime
		t.Errorf("verify's full report counts %d and lists %d differences, want 251 and %d", full.DifferenceCount, len(full.Differences), mover.DefaultMaxDifferences)
	case short.Omitted == 0 || len(short.Differences)+short.Omitted != len(full.Differences) || short.Differences[0] != full.Differences[0]:
		t.Errorf("termination message lists %d and omits %d of the full report's %d differences", len(short.Differences), short.Omitted, len(full.Differences))
	}
	if code, _, rep := runMain("verify", "--max-differences", "3", src, dst); code != mover.ExitDifferences || len(rep.Differences) != 3 {
		t.Errorf("verify --max-differences 3: exit %d, %d differences listed", code, len(rep.Differences))
	}

	for _, args := range [][]string{{}, {"move"}, {"copy", src}, {"scan", src, dst}, {"verify", "--workers", "-1", src, dst}} {
		var stdout, stderr bytes.Buffer
		if code := mover.Main(args, &stdout, &stderr); code != mover.ExitUsage || !strings.Contains(stderr.String(), "usage:") {
			t.Errorf("kip-mover %v: exit %d, want %d with the usage:\n%s", args, code, mover.ExitUsage, stderr.String())
		}
	}
	if code, _, rep := runMain("scan", filepath.Join(src, "file--0000")); code != mover.ExitError || !strings.Contains(rep.Error, "not a directory") {
		t.Errorf("scan of a file: exit %d, %q", code, rep.Error)
	}
}

func scan(t *testing.T, root string) *mover.Report {
	t.Helper()
	return mover.Scan(context.Background(), root, mover.Options{})
}

// buildMover builds cmd/kip-mover into the test's directory.
func buildMover(t *testing.T) string {
	t.Helper()
	goCmd := need.Command(t, "go", "install Go")
	bin := filepath.Join(t.TempDir(), "kip-mover")
	cmd := exec.Command(goCmd, "build", "-o", bin, "kipper.run/kip/cmd/kip-mover")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kip-mover: %v\n%s", err, out)
	}
	return bin
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
