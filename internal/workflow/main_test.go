package workflow_test

import (
	"os"
	"testing"

	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's tests; the helper process that
// TestKilledRunResumes starts runs against the parent's environment and never starts one.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
