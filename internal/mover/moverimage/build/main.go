// Command build builds the data mover's image (make mover-image): it writes the OCI archive to
// -out and checks the digest against manifests/mover-image.yaml, or with -pin writes the digest
// there.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"

	"kipper.run/kip/internal/mover/moverimage"
	"kipper.run/kip/manifests"
)

func main() {
	out := flag.String("out", "", "write the image's OCI archive here (ctr images import takes it)")
	pin := flag.Bool("pin", false, "write the image's digest and this Go release to manifests/mover-image.yaml")
	flag.Parse()
	if err := run(*out, *pin); err != nil {
		fmt.Fprintln(os.Stderr, "mover-image:", err)
		os.Exit(1)
	}
}

func run(out string, pin bool) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "manifests", "mover-image.yaml")); err != nil {
		return fmt.Errorf("run it from the repository's root: %w", err)
	}
	idx, err := moverimage.Build(context.Background(), "go", root)
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	p, err := manifests.MoverImage()
	if err != nil {
		return err
	}
	p.Digest = d.String()
	if out != "" {
		if err := moverimage.WriteArchive(idx, p.Reference(), out); err != nil {
			return err
		}
		fmt.Printf("wrote %s: %s\n", out, p.Reference())
	}
	if !pin {
		return moverimage.CheckPin(idx)
	}
	file := filepath.Join(root, "manifests", "mover-image.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	b = regexp.MustCompile(`(?m)^digest: .*$`).ReplaceAll(b, []byte("digest: "+p.Digest))
	b = regexp.MustCompile(`(?m)^go: .*$`).ReplaceAll(b, []byte("go: "+runtime.Version()))
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return err
	}
	fmt.Printf("pinned %s (built with %s) in manifests/mover-image.yaml\n", p.Reference(), runtime.Version())
	return nil
}
