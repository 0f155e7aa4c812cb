package lab

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
)

//go:embed image.sh
var imageScript string

// imageName names the base image after a hash of its recipe.
func imageName() string {
	sum := sha256.Sum256([]byte(imageScript))
	return "image-" + hex.EncodeToString(sum[:8])
}

// cacheDir is where the lab keeps what outlives a lab: ${KIP_CACHE_DIR:-~/.cache/kip}/lab.
func cacheDir() string {
	if d := os.Getenv("KIP_CACHE_DIR"); d != "" {
		return filepath.Join(d, "lab")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = filepath.Join(os.TempDir(), "cache")
	}
	return filepath.Join(d, "kip", "lab")
}

// imagePaths returns the cached tarball of the base image and the directory it is kept unpacked
// in, which is the lower layer of every host's disk.
func imagePaths() (tarball, dir string) {
	base := filepath.Join(cacheDir(), imageName())
	return base + ".tar.zst", base
}

// EnsureImage makes sure the base image is cached, building it when its tarball is missing (a
// few minutes; it brings the lab's network up for the apt cache while it builds unless a lab is
// up), and returns the tarball's path. logf, if not nil, receives progress.
func EnsureImage(ctx context.Context, logf func(format string, args ...any)) (string, error) {
	tarball, dir := imagePaths()
	if imageReady(tarball, dir) {
		return tarball, nil
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	unlock, st, err := acquire(ctx, flock.New(lockPath), logf)
	if err != nil {
		return "", err
	}
	defer unlock()
	_, errT := os.Stat(tarball)
	_, errD := os.Stat(dir)
	if errT != nil && errD != nil && st == nil { // a build needs the apt cache on the public bridge
		if err := addRoutes(ctx); err != nil {
			return "", err
		}
		if err := netUp(ctx); err != nil {
			return "", errors.Join(err, teardown(context.WithoutCancel(ctx), &state{}))
		}
		defer teardown(context.WithoutCancel(ctx), &state{})
	}
	if _, err := ensureImage(ctx, st == nil, logf); err != nil {
		return "", err
	}
	return tarball, nil
}

func imageReady(tarball, dir string) bool {
	_, errT := os.Stat(tarball)
	_, errD := os.Stat(dir)
	return errT == nil && errD == nil
}

// ensureImage returns the unpacked base image, unpacking the cached tarball, packing the tarball
// again from the unpacked image, or building both. A build needs the lab's apt cache. After a
// build, prune removes the images of other recipes: it must be false while a lab may be using
// one. logf receives progress.
func ensureImage(ctx context.Context, prune bool, logf func(format string, args ...any)) (string, error) {
	tarball, dir := imagePaths()
	if err := os.MkdirAll(cacheDir(), 0o755); err != nil {
		return "", err
	}
	lock := flock.New(filepath.Join(cacheDir(), "image.lock"))
	if _, err := lock.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return "", fmt.Errorf("lock the image cache: %w", err)
	}
	defer lock.Unlock()
	if imageReady(tarball, dir) {
		return dir, nil
	}
	// What a build or unpacking that died left behind.
	if stale, err := filepath.Glob(dir + ".tmp-*"); err == nil {
		for _, p := range stale {
			os.RemoveAll(p)
		}
	}
	if _, err := os.Stat(dir); err == nil { // complete, as it is renamed into place
		start := time.Now()
		if err := packAtomic(ctx, dir, tarball); err != nil {
			return "", err
		}
		logf("lab: packed the base image again in %s", time.Since(start).Round(100*time.Millisecond))
		return dir, nil
	}
	tmp := dir + ".tmp-" + strconv.Itoa(os.Getpid())
	defer os.RemoveAll(tmp)
	if _, err := os.Stat(tarball); err == nil {
		start := time.Now()
		if err := unpack(ctx, tarball, tmp); err != nil {
			return "", fmt.Errorf("unpack %s: %w", tarball, err)
		}
		if err := os.Rename(tmp, dir); err != nil {
			return "", err
		}
		logf("lab: unpacked the base image in %s", time.Since(start).Round(100*time.Millisecond))
		return dir, nil
	}
	if err := build(ctx, tmp, tarball, logf); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	if prune {
		old, _ := filepath.Glob(filepath.Join(cacheDir(), "image-*"))
		for _, p := range old {
			if !strings.HasPrefix(filepath.Base(p), imageName()) {
				os.RemoveAll(p)
			}
		}
	}
	return dir, nil
}

// build runs the recipe into dir and packs dir into tarball.
func build(ctx context.Context, dir, tarball string, logf func(format string, args ...any)) error {
	m, err := machineMirrors()
	if err != nil {
		return err
	}
	logPath := tarball + ".log"
	logf("lab: building the base image %s (a few minutes when the apt cache is cold; log in %s)", filepath.Base(tarball), logPath)
	start := time.Now()
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, "sh", "-c", imageScript, "kip-lab-image", dir, m.Archive, AptProxy)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the base image (log in %s): %w", logPath, err)
	}
	if err := packAtomic(ctx, dir, tarball); err != nil {
		return err
	}
	logf("lab: built the base image in %s", time.Since(start).Round(time.Second))
	return nil
}

// packAtomic writes dir as a zstd-compressed tarball to a temporary file renamed to tarball.
func packAtomic(ctx context.Context, dir, tarball string) error {
	tmp := tarball + ".tmp"
	defer os.Remove(tmp)
	if err := pack(ctx, dir, tmp); err != nil {
		return fmt.Errorf("pack the base image: %w", err)
	}
	return os.Rename(tmp, tarball)
}

// tarFlags keep owners by number, and extended attributes (file capabilities).
var tarFlags = []string{"--numeric-owner", "--xattrs", "--xattrs-include=*"}

// pack writes dir as a zstd-compressed tarball to path.
func pack(ctx context.Context, dir, path string) error {
	tar := exec.CommandContext(ctx, "tar", append(tarFlags, "-C", dir, "-cf", "-", ".")...)
	zstd := exec.CommandContext(ctx, "zstd", "-q", "-T0", "-3", "-f", "-o", path)
	return pipe(tar, zstd)
}

// unpack extracts the tarball at path into dir.
func unpack(ctx context.Context, path, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	zstd := exec.CommandContext(ctx, "zstd", "-q", "-dc", path)
	tar := exec.CommandContext(ctx, "tar", append(tarFlags, "-C", dir, "-xf", "-")...)
	return pipe(zstd, tar)
}

// pipe runs a | b.
func pipe(a, b *exec.Cmd) error {
	r, err := a.StdoutPipe()
	if err != nil {
		return err
	}
	b.Stdin = r
	var errA, errB stderrBuf
	a.Stderr, b.Stderr = &errA, &errB
	if err := a.Start(); err != nil {
		return err
	}
	if err := b.Run(); err != nil {
		a.Process.Kill()
		a.Wait()
		return fmt.Errorf("%s: %w: %s", b.Path, err, errB)
	}
	if err := a.Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", a.Path, err, errA)
	}
	return nil
}

// stderrBuf keeps the start of what a command writes to stderr.
type stderrBuf []byte

func (s *stderrBuf) Write(p []byte) (int, error) {
	if room := 4096 - len(*s); room > 0 {
		*s = append(*s, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (s stderrBuf) String() string { return string(s) }
