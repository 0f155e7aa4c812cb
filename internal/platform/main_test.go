package platform

import (
	"os"
	"testing"

	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's tests (started on first use by
// testenv.Get, stopped when the tests end).
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
