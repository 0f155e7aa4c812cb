//go:build !kipfault

package workflow

// faultPoint is a fault-injection point. Only a binary built with -tags kipfault acts on it (see
// fault_kipfault.go); in kip as shipped it does nothing and compiles to nothing.
func faultPoint(string, *Step) {}
