package workflow_test

import (
	"os"
	"testing"

	"kipper.run/kip/test/testenv"
)

// asHelper, set by kill_test.go (built with -tags kipfault), runs the binary as the helper
// process of TestKilledRunResumes when its environment asks for that, and then never returns.
var asHelper = func() {}

// TestMain shares one API test environment among this package's tests. Run as the helper
// process of TestKilledRunResumes, the binary runs the demo workflow against the parent's
// environment instead, and never starts one.
func TestMain(m *testing.M) {
	asHelper()
	os.Exit(testenv.Main(m))
}
