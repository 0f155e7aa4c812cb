package moverimage_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"kipper.run/kip/internal/mover/moverimage"
	"kipper.run/kip/internal/mover/movertest"
	"kipper.run/kip/manifests"
)

// The image built from this checkout is the one manifests/mover-image.yaml pins, and holds the
// mover alone, for each platform.
func TestImageIsPinned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	idx := movertest.Image(ctx, t)
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != len(moverimage.Platforms) {
		t.Fatalf("the index holds %d images, want %d", len(m.Manifests), len(moverimage.Platforms))
	}
	for i, desc := range m.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		want := moverimage.Platforms[i]
		if desc.Platform == nil || desc.Platform.Architecture != want.Architecture || cfg.Architecture != want.Architecture ||
			len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != moverimage.Entrypoint || cfg.Config.User != "0:0" {
			t.Errorf("image %d: platform %v, config %+v", i, desc.Platform, cfg.Config)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("image %d: %d layers (%v), want 1", i, len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			if h.Mode != 0o755 || h.Uid != 0 || !h.ModTime.Equal(time.Unix(0, 0)) {
				t.Errorf("%s: mode %o, uid %d, time %s", h.Name, h.Mode, h.Uid, h.ModTime)
			}
		}
		rc.Close()
		if len(names) != 1 || names[0] != "kip-mover" {
			t.Errorf("image %d holds %v, want the mover alone", i, names)
		}
	}

	// The archive the lab imports names the pinned reference and holds the same index.
	pin, err := manifests.MoverImage()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := moverimage.WriteArchive(idx, pin.Reference(), archive); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := untar(archive, dir); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest.String() != pin.Digest || tm.Manifests[0].Annotations["io.containerd.image.name"] != pin.Reference() {
		t.Errorf("the archive's index %+v does not name %s", tm.Manifests, pin.Reference())
	}
}
