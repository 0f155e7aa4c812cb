//go:build !linux

package testenv

import "syscall"

// sysProcAttr puts a child in its own process group so Stop can kill it whole. Only Linux can
// also tie the child's life to the test binary's.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
