//go:build !linux

package controlplane

import "syscall"

// SysProcAttr puts a child in its own process group, so that it can be stopped whole. Only Linux
// can also tie the child's life to its parent's.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
