package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// fsSize is the size of the ext4 file system in the image or device at path, from its
// superblock (1024 bytes in): s_blocks_count_lo at 4, s_log_block_size at 24, the magic 0xEF53 at
// 56, s_feature_incompat at 96 (64bit: 0x80) and s_blocks_count_hi at 336.
func fsSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, fmt.Errorf("read the superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[56:]) != 0xEF53 {
		return 0, fmt.Errorf("%s holds no ext4 file system", path)
	}
	blocks := uint64(le.Uint32(sb[4:]))
	if le.Uint32(sb[96:])&0x80 != 0 {
		blocks |= uint64(le.Uint32(sb[336:])) << 32
	}
	return int64(blocks) << (10 + le.Uint32(sb[24:])), nil
}

// growFS grows the file system in an unmounted image to the image's size, offline: e2fsck, then
// resize2fs. A lab host cannot grow a mounted ext4 (the kernel's online resize needs
// CAP_SYS_RESOURCE, which lab hosts lack), so volumes grow when they are next staged.
func growFS(ctx context.Context, img string) error {
	st, err := os.Stat(img)
	if err != nil {
		return err
	}
	size, err := fsSize(img)
	if err != nil || size >= st.Size() {
		return err
	}
	// e2fsck -p exits 1 when it corrected something, which still lets the resize go on.
	out, err := exec.CommandContext(ctx, "e2fsck", "-f", "-p", img).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return fmt.Errorf("e2fsck %s: %v: %s", img, err, out)
	}
	if out, err := exec.CommandContext(ctx, "resize2fs", img).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", img, err, out)
	}
	return nil
}
