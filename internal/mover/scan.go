package mover

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Scan counts the tree at root: its files, directories, symlinks and special files, and the bytes
// its regular files hold, each hard-linked file's once.
func Scan(ctx context.Context, root string, o Options) *Report {
	start := time.Now()
	r := newRun(ctx, o)
	rep := &Report{Format: ReportFormat, Op: OpScan, Source: root}
	st, err := rootDir("tree", root)
	if err == nil {
		r.counts.count(&st, true)
		var mu sync.Mutex
		seen := map[inode]bool{}
		r.pool.submit(func() {
			r.walk(root, ".", func(_, _ string, st *unix.Stat_t) (bool, error) {
				first := true
				if isType(st, unix.S_IFREG) && st.Nlink > 1 {
					mu.Lock()
					first = !seen[inodeOf(st)]
					seen[inodeOf(st)] = true
					mu.Unlock()
				}
				r.counts.count(st, first)
				return isType(st, unix.S_IFDIR), nil
			})
		})
		r.work(OpScan)
		err = r.firstErr()
	}
	return r.finish(rep, start, err)
}
