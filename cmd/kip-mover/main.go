// Command kip-mover is the data mover that runs in kip's copy and verify pods (internal/mover).
package main

import (
	"os"

	"kipper.run/kip/internal/mover"
)

func main() {
	os.Exit(mover.Main(os.Args[1:], os.Stdout, os.Stderr))
}
