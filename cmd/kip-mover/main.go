// Command kip-mover is the data mover that runs in kip's copy and verify pods (internal/storage/mover).
package main

import (
	"os"

	"kipper.run/kip/internal/storage/mover"
)

func main() {
	os.Exit(mover.Main(os.Args[1:], os.Stdout, os.Stderr))
}
