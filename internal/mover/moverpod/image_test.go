package moverpod

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/manifests"
)

// ociArchive is an OCI archive whose index.json names digest and that holds blob under
// blobDigest.
func ociArchive(t *testing.T, digest, blobDigest string, blob []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", fmt.Appendf(nil, `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":%q,"size":%d}]}`, digest, len(blob))},
		{"blobs/sha256/" + strings.TrimPrefix(blobDigest, "sha256:"), blob},
	} {
		if err := w.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestCheckArchive(t *testing.T) {
	index := []byte(`{"schemaVersion":2,"manifests":[]}`)
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256(index))
	other := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("other")))
	for _, tc := range []struct {
		name    string
		archive []byte
		want    string
	}{
		{"the pinned index", ociArchive(t, digest, digest, index), ""},
		{"index.json names another", ociArchive(t, other, digest, index), "its index.json does not name " + digest},
		{"the index is missing", ociArchive(t, digest, other, []byte("other")), "it does not hold " + digest},
		{"the index was changed", ociArchive(t, digest, digest, append(index, ' ')), "its blob " + digest + " has digest sha256:"},
		{"not a tar", []byte("not an archive at all, and long enough to be read as a header"), "read the archive"},
	} {
		err := checkArchive(tc.archive, digest)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestParseImageList(t *testing.T) {
	const ref = "ghcr.io/getkipper/kip-mover@sha256:f535f4a819e67aca2c6a4fb6e2ecbdbbeb0223320cabc278deec9b78610a914e"
	out := "REF                                         TYPE                                    DIGEST                                                                  SIZE    PLATFORMS                 LABELS\n" +
		"docker.io/library/busybox:1.36              application/vnd.oci.image.index.v1+json sha256:1111111111111111111111111111111111111111111111111111111111111111 2.1 MiB linux/amd64               io.cri-containerd.image=managed\n" +
		ref + " application/vnd.oci.image.index.v1+json sha256:f535f4a819e67aca2c6a4fb6e2ecbdbbeb0223320cabc278deec9b78610a914e 1.1 MiB linux/amd64,linux/arm64 -\n"
	if got := parseImageList([]byte(out), ref); got != "sha256:f535f4a819e67aca2c6a4fb6e2ecbdbbeb0223320cabc278deec9b78610a914e" {
		t.Errorf("the mover's digest: %q", got)
	}
	if got := parseImageList([]byte(out), "ghcr.io/getkipper/kip-mover"); got != "" {
		t.Errorf("a reference that is not listed: %q", got)
	}
}

// node is a node's containerd as ctr shows it: the images it holds by reference. Importing
// stores what imported names the archive as.
type node struct {
	images   map[string]string
	imported string
	imports  int
}

func (n *node) Query(_ context.Context, cmd string) ([]byte, error) {
	if cmd != ctr("images", "list") {
		return nil, fmt.Errorf("unexpected query %q", cmd)
	}
	out := "REF TYPE DIGEST SIZE PLATFORMS LABELS\n"
	for ref, d := range n.images {
		out += ref + " application/vnd.oci.image.index.v1+json " + d + " 1.1 MiB linux/amd64 -\n"
	}
	return []byte(out), nil
}

func (n *node) RunInput(_ context.Context, cmd string, stdin io.Reader) (sshx.Result, error) {
	if cmd != ctr("images", "import", "-") {
		return sshx.Result{}, fmt.Errorf("unexpected command %q", cmd)
	}
	b, err := io.ReadAll(stdin)
	if err != nil {
		return sshx.Result{}, err
	}
	want, err := Archive()
	if err != nil || !bytes.Equal(b, want) {
		return sshx.Result{}, errors.Join(err, errors.New("the import's input is not the archive kip carries"))
	}
	pin, err := manifests.MoverImage()
	if err != nil {
		return sshx.Result{}, err
	}
	n.images[pin.Reference()] = n.imported
	n.imports++
	return sshx.Result{Command: cmd}, nil
}

func TestDeliver(t *testing.T) {
	if _, err := Archive(); errors.Is(err, ErrNoArchive) {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI builds kip with 'make build-fault', which writes the mover's image archive first:", err)
		}
		t.Skip("the mover's image archive is not built ('make mover-image' writes it):", err)
	}
	pin, err := manifests.MoverImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := &node{images: map[string]string{"docker.io/library/busybox:1.36": "sha256:1111"}, imported: pin.Digest}
	for i, want := range []bool{true, false} {
		imported, err := Deliver(ctx, n)
		if err != nil || imported != want || n.imports != 1 {
			t.Fatalf("delivery %d: imported %v, %v; %d imports, want imported %v and 1 import", i+1, imported, err, n.imports, want)
		}
	}
	// A containerd that stores the import under another digest is caught.
	n = &node{images: map[string]string{}, imported: "sha256:2222"}
	if _, err := Deliver(ctx, n); err == nil || !strings.Contains(err.Error(), "as sha256:2222 after kip imported it, not the pinned "+pin.Digest) {
		t.Errorf("an import that holds another digest: %v", err)
	}
}
