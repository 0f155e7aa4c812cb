package moverpod

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/manifests"
)

// embedded holds image/kip-mover-image.tar, the OCI archive of the mover's pinned image, which
// make build writes there before it builds kip (image/README.md).
//
//go:embed image
var embedded embed.FS

const archiveFile = "image/kip-mover-image.tar"

// ErrNoArchive is a kip built without the mover's image (go build without make).
var ErrNoArchive = errors.New("this kip was built without the data mover's image, which a move imports on the node that runs its pods: build kip with 'make build', which builds the image first")

// Archive is the OCI archive of the mover's image that this kip carries, checked to hold the
// pinned image.
func Archive() ([]byte, error) {
	b, err := embedded.ReadFile(archiveFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoArchive
	}
	if err != nil {
		return nil, err
	}
	pin, err := manifests.MoverImage()
	if err != nil {
		return nil, err
	}
	if err := checkArchive(b, pin.Digest); err != nil {
		return nil, fmt.Errorf("the data mover's image this kip carries is not the pinned %s: %w; build kip again with 'make build'", pin.Reference(), err)
	}
	return b, nil
}

// checkArchive checks that the OCI archive b names the image index digest in its index.json and
// holds that index, whose content has that digest. The blobs it names are checked by containerd
// as it imports them.
func checkArchive(b []byte, digest string) error {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok {
		return fmt.Errorf("digest %q is not a sha256 digest", digest)
	}
	var named, held bool
	r := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read the archive: %w", err)
		}
		switch h.Name {
		case "index.json":
			var idx struct {
				Manifests []struct {
					Digest string `json:"digest"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(r).Decode(&idx); err != nil {
				return fmt.Errorf("read the archive's index.json: %w", err)
			}
			for _, m := range idx.Manifests {
				named = named || m.Digest == digest
			}
		case "blobs/sha256/" + hex:
			sum := sha256.New()
			if _, err := io.Copy(sum, r); err != nil {
				return fmt.Errorf("read the archive: %w", err)
			}
			if got := fmt.Sprintf("sha256:%x", sum.Sum(nil)); got != digest {
				return fmt.Errorf("its blob %s has digest %s", digest, got)
			}
			held = true
		}
	}
	switch {
	case !named:
		return fmt.Errorf("its index.json does not name %s", digest)
	case !held:
		return fmt.Errorf("it does not hold %s", digest)
	}
	return nil
}

// Host is a node kip reaches over SSH (sshx.Client).
type Host interface {
	Query(ctx context.Context, cmd string) ([]byte, error)
	RunInput(ctx context.Context, cmd string, stdin io.Reader) (sshx.Result, error)
}

// The containerd that k3s runs, and the namespace where the kubelet's images are.
const (
	containerdSocket = "/run/k3s/containerd/containerd.sock"
	criNamespace     = "k8s.io"
)

// ctr is the command line of k3s's bundled ctr on the kubelet's containerd.
func ctr(args ...string) string {
	return sshx.Command(k3s.BinaryPath, append([]string{"ctr", "--address", containerdSocket, "--namespace", criNamespace}, args...)...)
}

// Deliver makes sure that the node h reaches holds the mover's image under its pinned
// reference, as the mover's pods name it (they never pull it: nothing publishes it): when its
// containerd does not, kip imports the archive it carries over SSH and checks the digest the
// node then holds. It reports whether it imported the image.
func Deliver(ctx context.Context, h Host) (bool, error) {
	pin, err := manifests.MoverImage()
	if err != nil {
		return false, err
	}
	have, err := imageDigest(ctx, h, pin.Reference())
	if err != nil || have == pin.Digest {
		return false, err
	}
	archive, err := Archive()
	if err != nil {
		return false, err
	}
	res, err := h.RunInput(ctx, ctr("images", "import", "-"), bytes.NewReader(archive))
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		return false, fmt.Errorf("import the data mover's image into the node's containerd: %w", err)
	}
	if have, err = imageDigest(ctx, h, pin.Reference()); err != nil {
		return false, err
	}
	if have != pin.Digest {
		return false, fmt.Errorf("the node's containerd holds %q as %s after kip imported it, not the pinned %s", pin.Reference(), orNothing(have), pin.Digest)
	}
	return true, nil
}

// imageDigest is the digest the node's containerd holds ref as, "" when it holds no such image.
func imageDigest(ctx context.Context, h Host, ref string) (string, error) {
	out, err := h.Query(ctx, ctr("images", "list"))
	if err != nil {
		return "", fmt.Errorf("list the images of the node's containerd: %w", err)
	}
	return parseImageList(out, ref), nil
}

// parseImageList reads ctr images list's table (REF TYPE DIGEST SIZE PLATFORMS LABELS) and
// returns ref's digest, "" when ref is not listed.
func parseImageList(out []byte, ref string) string {
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 3 && f[0] == ref {
			return f[2]
		}
	}
	return ""
}

func orNothing(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}
