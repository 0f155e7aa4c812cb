package credential_test

import (
	"os"
	"testing"

	"kipper.run/kip/test/testenv"
)

// asHelper, set by everywrite_api_test.go (built with -tags kipfault), runs the binary as the
// helper process of TestSeedKilledAfterEveryWrite when its environment asks for that, and then
// never returns.
var asHelper = func() {}

// TestMain shares one API test environment among this package's tests (testenv.Get). Run as a
// helper process, the binary seeds the parent's environment instead, and never starts one.
func TestMain(m *testing.M) {
	asHelper()
	os.Exit(testenv.Main(m))
}
