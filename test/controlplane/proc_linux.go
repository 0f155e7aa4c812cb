package controlplane

import "syscall"

// SysProcAttr puts a child in its own process group (so that it can be stopped whole, and a
// terminal's Ctrl-C reaches only its parent) and has the kernel kill it when its parent dies.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
