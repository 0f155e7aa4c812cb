package workflow_test

import (
	"fmt"
	"os"
	"testing"

	"kipper.run/kip/test/testenv"
)

// TestMain shares one API test environment among this package's tests. Run as the helper
// process of TestKilledRunResumes (its environment variables set), the binary runs the demo
// workflow against the parent's environment instead, and never starts one.
func TestMain(m *testing.M) {
	if kubeconfig := os.Getenv(helperKubeconfig); kubeconfig != "" {
		if err := helperProcess(kubeconfig); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testenv.Main(m))
}
