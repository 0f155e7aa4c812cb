// Package buildinfo holds the version and commit stamped into kip at build time
// (go build -ldflags "-X kipper.run/kip/internal/buildinfo.Version=v0.1.0 -X ...Commit=abc").
package buildinfo

var (
	// Version is kip's release version; "dev" for a build from source.
	Version = "dev"
	// Commit is the git commit kip was built from.
	Commit = "unknown"
)
