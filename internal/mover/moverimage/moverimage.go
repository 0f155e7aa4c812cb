// Package moverimage builds the data mover's container image (cmd/kip-mover alone) reproducibly:
// the same source and Go release give the same digest, which manifests/mover-image.yaml pins and
// kip's copy and verify pods name.
package moverimage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"kipper.run/kip/manifests"
)

// Platforms are the platforms the image holds.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// Entrypoint is where the image holds the mover.
const Entrypoint = "/kip-mover"

var epoch = time.Unix(0, 0).UTC()

// Build builds cmd/kip-mover of the module at moduleDir with goCmd for each platform and returns
// the image index. Everything that could vary between machines is fixed: no cgo, no VCS stamp,
// no build ID, trimmed paths, the baseline instruction sets, the epoch as every time.
func Build(ctx context.Context, goCmd, moduleDir string) (v1.ImageIndex, error) {
	tmp, err := os.MkdirTemp("", "kip-mover-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range Platforms {
		bin := filepath.Join(tmp, "kip-mover-"+p.Architecture)
		cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, "./cmd/kip-mover")
		cmd.Dir = moduleDir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture,
			"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=", "GOEXPERIMENT=", "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/kip-mover for %s/%s: %v\n%s", p.OS, p.Architecture, err, out)
		}
		img, err := image(bin, p)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// image is one platform's image: a single layer holding the binary at Entrypoint.
func image(bin string, p v1.Platform) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: Entrypoint[1:], Mode: 0o755, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatUSTAR}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "kip internal/mover/moverimage"}})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Created = p.OS, p.Architecture, v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{Entrypoint}
	cfg.Config.User = "0:0"
	return mutate.ConfigFile(img, cfg)
}

// WriteArchive writes idx as an OCI image layout in a tar archive at path, which
// `ctr images import` takes: its index names the image name.
func WriteArchive(idx v1.ImageIndex, name, path string) error {
	dir, err := os.MkdirTemp("", "kip-mover-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	})); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := tarDir(f, dir); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tarDir writes the files under dir into w, in walk order, owned by root at the epoch.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
		if fi.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// CheckPin compares idx with the pin in manifests/mover-image.yaml.
func CheckPin(idx v1.ImageIndex) error {
	pin, err := manifests.MoverImage()
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	if d.String() == pin.Digest {
		return nil
	}
	if runtime.Version() != pin.Go {
		return fmt.Errorf("manifests/mover-image.yaml pins %s, built with %s, but this is %s, which builds %s: build with %s, or run make mover-image-pin and commit the new pin",
			pin.Digest, pin.Go, runtime.Version(), d, pin.Go)
	}
	return fmt.Errorf("manifests/mover-image.yaml pins %s, but the mover built from this checkout is %s: run make mover-image-pin and commit the new pin",
		pin.Digest, d)
}
