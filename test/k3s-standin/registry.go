package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kipper.run/kip/test/controlplane"
)

// The lab's registry mirror (stand-in only). A k3s node of an airgapped site pulls through a
// mirror named in registries.yaml; the lab has no registry at all, and a pod whose
// imagePullPolicy is Always (kip's console) must pull. So each stand-in node serves the images
// of its airgap tarballs on mirrorAddr (go-containerregistry's registry, its blobs in
// agent/standin-registry) and points containerd at it, as k3s's registries.yaml would, for every
// registry those images name.
const mirrorAddr = "127.0.0.1:5999"

// serveMirror starts the mirror with the images of agent/images/*.tar until bg ends, and writes
// containerd's hosts.toml for their registries under certsDir.
func (n *node) serveMirror(ctx, bg context.Context, certsDir string, bgGo func(func())) error {
	ln, err := net.Listen("tcp", mirrorAddr)
	if err != nil {
		return fmt.Errorf("the lab's registry mirror: %w", err)
	}
	blobs := filepath.Join(n.agentDir(), "standin-registry")
	if err := os.RemoveAll(blobs); err != nil {
		return err
	}
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(blobs)))}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	bgGo(func() {
		<-bg.Done()
		srv.Close()
	})
	files, err := filepath.Glob(filepath.Join(n.imagesDir(), "*.tar"))
	if err != nil {
		return err
	}
	var registries []string
	for _, f := range files {
		manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(f) })
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		for _, d := range manifest {
			for _, t := range d.RepoTags {
				tag, err := name.NewTag(t)
				if err != nil {
					return fmt.Errorf("%s: image %q: %w", f, t, err)
				}
				img, err := tarball.ImageFromPath(f, &tag)
				if err != nil {
					return fmt.Errorf("%s: image %s: %w", f, t, err)
				}
				local, err := name.NewTag(mirrorAddr+"/"+tag.RepositoryStr()+":"+tag.TagStr(), name.Insecure)
				if err != nil {
					return err
				}
				if err := remote.Write(local, img, remote.WithContext(ctx)); err != nil {
					return fmt.Errorf("serve %s in the lab's registry mirror: %w", t, err)
				}
				reg := tag.RegistryStr()
				if reg == name.DefaultRegistry {
					reg = "docker.io" // containerd's name for it
				}
				if !slices.Contains(registries, reg) {
					registries = append(registries, reg)
				}
			}
		}
	}
	for _, reg := range registries {
		hosts := fmt.Sprintf("# Written by the k3s stand-in: the lab's registry mirror serves %s's images.\nserver = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n",
			reg, "https://"+reg, "http://"+mirrorAddr)
		if err := controlplane.WriteFile(filepath.Join(certsDir, reg, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	debug.FreeOSMemory() // what reading the archives took
	slog.Info("the lab's registry mirror serves the airgap images", "address", mirrorAddr, "registries", strings.Join(registries, ","))
	return nil
}
