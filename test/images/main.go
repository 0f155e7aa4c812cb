// Command images builds the container image archives the test lab's hosts import into
// containerd (ctr -n k8s.io images import), the way a k3s airgap install imports
// /var/lib/rancher/k3s/agent/images/*.tar: no docker, no registry. Each image is one
// deterministic layer holding binaries built elsewhere (-bin, by make testenv), Debian's
// static busybox, or programs installed on this machine with the shared libraries they load
// (-set postgres: Debian's PostgreSQL 15), tagged with the reference k3s itself uses (or the
// image's official one) so that pod specs are the same in the lab and on a real cluster.
//
//	go run ./test/images [-set testenv|velero] -bin DIR -busybox /bin/busybox -out DIR
//	go run ./test/images -set postgres -busybox /bin/busybox -out DIR
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kipper.run/kip/manifests"
)

// defaultPath is the PATH the images that run a shell or look up commands set.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is every layer entry's mtime and every config's creation time, so the same inputs give
// the same digests.
var epoch = time.Unix(0, 0).UTC()

// binary is a file in an image copied from the -bin directory.
type binary struct {
	path string // absolute path inside the image
	bin  string // file name in the -bin directory
}

// image is one archive the tool writes.
type image struct {
	file       string // archive name in -out
	ref        string // image reference k3s uses
	bins       []binary
	busybox    bool              // add /bin/busybox and a /bin/<applet> symlink for each applet
	files      map[string]string // more files (path inside the image → content), mode 0644
	pin        string            // the component of manifests/versions.yaml whose image:version ref is
	entrypoint []string
	cmd        []string
	env        []string
	// set is the -set that builds the image: setTestenv (the default), setVelero or setPostgres.
	set string

	// host are paths on this machine copied at the same paths: files, and directory trees with
	// their files, directories and symlinks (host modes); every dynamically linked ELF file among
	// them brings the shared libraries ldd lists for it, the dynamic loader included, at the
	// paths ldd gives. skip are host paths left out of host's trees.
	host, skip []string
	// passwd and group are lines appended to /etc/passwd and /etc/group.
	passwd, group string
	dirs          map[string]dirSpec // more directories: path → mode and owner
	links         map[string]string  // symlinks: path → target
	scripts       map[string]string  // executable files (path → content), mode 0755
	stopSignal    string             // the config's StopSignal
	ports         []string           // the config's ExposedPorts ("5432/tcp")
	volumes       []string           // the config's Volumes
}

// dirSpec is a directory of an image: its mode (with the sticky and set-id bits) and its owner
// (uid and gid alike).
type dirSpec struct {
	mode int64
	uid  int
}

// Image sets: -set testenv builds the lab's own images from make testenv's binaries (-bin
// bin/testenv); -set velero builds Velero's from those of sh tools/testenv.sh velero (-bin bin/velero), which the
// backup tests import on the hosts that run Velero; -set postgres builds PostgreSQL's from this
// machine's Debian packages (sh tools/testenv.sh postgres, into bin/postgres; no -bin).
const (
	setTestenv  = "testenv"
	setVelero   = "velero"
	setPostgres = "postgres"
)

// Debian's PostgreSQL 15 (packages postgresql-15 and postgresql-client-15): its programs, the
// modules they load and the data initdb reads.
const (
	pgBin   = "/usr/lib/postgresql/15/bin"
	pgLib   = "/usr/lib/postgresql/15/lib"
	pgShare = "/usr/share/postgresql/15"
	// pgUID is the official image's postgres user and group (uid and gid 999).
	pgUID = 999
)

// postgresEntrypoint is the postgres image's /usr/local/bin/docker-entrypoint.sh, a stand-in
// for the official image's.
//
//go:embed docker-entrypoint.sh
var postgresEntrypoint string

// images is what the tool builds; adding an image is one entry.
var images = []image{
	{
		file:       "pause.tar",
		ref:        "docker.io/rancher/mirrored-pause:3.6",
		bins:       []binary{{path: "/pause", bin: "pause"}},
		entrypoint: []string{"/pause"},
	},
	{
		file:       "coredns.tar",
		ref:        "docker.io/rancher/mirrored-coredns-coredns:1.14.6",
		bins:       []binary{{path: "/coredns", bin: "coredns"}},
		entrypoint: []string{"/coredns"},
	},
	{
		file: "local-path-provisioner.tar",
		ref:  "docker.io/rancher/local-path-provisioner:v0.0.30",
		bins: []binary{{path: "/usr/bin/local-path-provisioner", bin: "local-path-provisioner"}},
		env:  []string{defaultPath},
	},
	{
		file:    "busybox.tar",
		ref:     "docker.io/rancher/mirrored-library-busybox:1.37.0",
		busybox: true,
		cmd:     []string{"sh"},
		env:     []string{defaultPath},
	},
	// Stand-ins. helm-controller's Job image (the k3s stand-in's helmJobImage): the lab installs
	// charts as objects only (its chart fixtures), so the Job's pod says so and succeeds.
	{
		file:       "klipper-helm.tar",
		ref:        "docker.io/rancher/klipper-helm:v0.9.10-build20251111",
		busybox:    true,
		env:        []string{defaultPath},
		entrypoint: []string{"/bin/sh", "-c", `echo "k3s stand-in's helm job: helm $*: nothing is installed (chart fixtures stand in for the chart)"`, "klipper-helm"},
	},
	// The Kipper console, which cannot run here: each answers HTTP on the console's ports
	// (internal/components: the UI on 80, console-api on 8080 and its metrics on 8081).
	consoleStandIn("kipper-console.tar", "console", "exec httpd -f -p 80 -h /www"),
	consoleStandIn("kipper-console-api.tar", "console-api", "httpd -p 8081 -h /www && exec httpd -f -p 8080 -h /www"),
	// Zot, the cluster registry, which the lab cannot pull either: busybox's httpd answers the
	// registry API's version check (GET /v2/ → 200) on Zot's port, under the image of Zot's chart.
	// The chart's fixture (test/e2e's UploadChartFixtures) runs it, so that kip node add's
	// registry check has a registry to reach through the node port.
	{
		file: "zot.tar", ref: "ghcr.io/project-zot/zot-linux-amd64:v2.1.18", busybox: true,
		files: map[string]string{"/www/v2/index.html": "{}\n"},
		env:   []string{defaultPath},
		// httpd as the container's first process would ignore SIGTERM; Zot ends on it.
		entrypoint: []string{"/bin/sh", "-c", "httpd -f -p 5000 -h /www & trap 'kill $!' TERM; wait"},
	},
	// Velero's server and node agent (one binary, as in Velero's image, with the restore helper
	// its file-system restores run as an init container) and its AWS plugin, whose image copies
	// the plugin into the server's plugin directory (the chart's init container mounts it at
	// /target), all built from their modules by tools/testenv.sh.
	{
		file: "velero.tar", pin: "velero", set: setVelero,
		bins: []binary{{path: "/velero", bin: "velero"}, {path: "/velero-restore-helper", bin: "velero-restore-helper"}},
		env:  []string{defaultPath}, entrypoint: []string{"/velero"},
	},
	{
		file: "velero-plugin-for-aws.tar", pin: "velero-plugin-for-aws", set: setVelero, busybox: true,
		bins:       []binary{{path: "/plugins/velero-plugin-for-aws", bin: "plugins/velero-plugin-for-aws"}},
		env:        []string{defaultPath},
		entrypoint: []string{"/bin/sh", "-c", "cp /plugins/velero-plugin-for-aws /target/velero-plugin-for-aws"},
	},
	// PostgreSQL 15 under the official image's reference: Debian's real server and client
	// programs, the modules the server loads (not LLVM's JIT, which it then runs without),
	// initdb's data, the time zones Debian's build reads from the system, glibc's C.UTF-8 locale
	// and its locale program (initdb imports the collations locale -a lists), with the libraries
	// they load; busybox for the shell and tools. What stands in is the entrypoint
	// (docker-entrypoint.sh), which keeps the official one's environment interface. The account,
	// directories, environment, stop signal, port and volume are the official image's
	// (github.com/docker-library/postgres, 15/bookworm/Dockerfile), but LANG is C.UTF-8 (the
	// official en_US.utf8 needs the locales package).
	{
		file: "postgres.tar", ref: "docker.io/library/postgres:15", set: setPostgres, busybox: true,
		host:   []string{pgBin, pgLib, pgShare, "/usr/share/zoneinfo", "/usr/lib/locale/C.utf8", "/usr/bin/locale"},
		skip:   []string{pgLib + "/bitcode", pgLib + "/pgxs", pgLib + "/llvmjit.so", pgLib + "/llvmjit_types.bc", pgShare + "/man"},
		passwd: "postgres:x:999:999::/var/lib/postgresql:/bin/sh\n",
		group:  "postgres:x:999:\n",
		dirs: map[string]dirSpec{
			"/var/lib/postgresql":         {mode: 0o755, uid: pgUID},
			"/var/lib/postgresql/data":    {mode: 0o1777, uid: pgUID},
			"/var/run/postgresql":         {mode: 0o3777, uid: pgUID},
			"/docker-entrypoint-initdb.d": {mode: 0o755},
		},
		links:      map[string]string{"/etc/localtime": "/usr/share/zoneinfo/Etc/UTC"},
		scripts:    map[string]string{"/usr/local/bin/docker-entrypoint.sh": postgresEntrypoint},
		entrypoint: []string{"docker-entrypoint.sh"},
		cmd:        []string{"postgres"},
		env:        []string{defaultPath + ":" + pgBin, "LANG=C.UTF-8", "PG_MAJOR=15", "PGDATA=/var/lib/postgresql/data"},
		stopSignal: "SIGINT",
		ports:      []string{"5432/tcp"},
		volumes:    []string{"/var/lib/postgresql/data"},
	},
}

// consoleStandIn is a console image: busybox's httpd serving consolePage, started by script,
// under the reference manifests/versions.yaml pins for component pin.
func consoleStandIn(file, pin, script string) image {
	return image{
		file: file, pin: pin, busybox: true,
		files:      map[string]string{"/www/index.html": consolePage},
		env:        []string{defaultPath},
		entrypoint: []string{"/bin/sh", "-c", script},
	}
}

// consolePage is what the console stand-ins serve.
const consolePage = "kip's test lab: a stand-in for the Kipper console; it does nothing else.\n"

// resolveRefs sets the reference of each image pinned in manifests/versions.yaml: the image and
// version kip deploys.
func resolveRefs() error {
	pins, err := manifests.Pinned()
	if err != nil {
		return err
	}
	for i := range images {
		if images[i].pin == "" {
			continue
		}
		c, err := pins.Component(images[i].pin)
		if err != nil {
			return err
		}
		images[i].ref = c.Image + ":" + c.Version
	}
	return nil
}

const (
	passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	group  = "root:x:0:\nnogroup:x:65534:\n"
)

func main() {
	binDir := flag.String("bin", "", "directory holding the binaries of the set's images: bin/testenv's coredns, local-path-provisioner and pause, or bin/velero's velero, velero-restore-helper and plugins/velero-plugin-for-aws (not for -set postgres)")
	set := flag.String("set", setTestenv, "which images to build: testenv (the lab's own), velero (Velero's server and AWS plugin) or postgres (PostgreSQL 15 from this machine's Debian packages)")
	busybox := flag.String("busybox", "/bin/busybox", "Debian's static busybox (apt-get install busybox-static)")
	outDir := flag.String("out", "", "directory to write the image archives to")
	flag.Parse()
	needBin := *set != setPostgres
	if *binDir == "" && needBin || *outDir == "" || flag.NArg() > 0 || *set != setTestenv && *set != setVelero && *set != setPostgres {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/images [-set testenv|velero] -bin DIR [-busybox PATH] -out DIR\n       go run ./test/images -set postgres [-busybox PATH] -out DIR")
		os.Exit(2)
	}
	if err := build(*set, *binDir, *busybox, *outDir); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// imagesOf returns the images of set.
func imagesOf(set string) []image {
	var out []image
	for _, im := range images {
		if im.set == set || im.set == "" && set == setTestenv {
			out = append(out, im)
		}
	}
	return out
}

// build writes the archive of every image of set into outDir.
func build(set, binDir, busybox, outDir string) error {
	if err := resolveRefs(); err != nil {
		return err
	}
	images := imagesOf(set)
	if err := checkInputs(images, binDir, busybox); err != nil {
		return err
	}
	applets, err := busyboxApplets(busybox)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	for _, im := range images {
		img, err := im.build(binDir, busybox, applets)
		if err != nil {
			return fmt.Errorf("%s: %w", im.ref, err)
		}
		if err := writeArchive(filepath.Join(outDir, im.file), im.ref, img); err != nil {
			return fmt.Errorf("%s: %w", im.ref, err)
		}
	}
	return nil
}

// checkInputs reports every binary the images need that is missing from binDir, every host path
// that is missing from this machine, and a busybox that is missing or dynamically linked.
func checkInputs(images []image, binDir, busybox string) error {
	var missing, missingHost []string
	for _, im := range images {
		for _, b := range im.bins {
			p := filepath.Join(binDir, b.bin)
			if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
				missing = append(missing, p)
			}
		}
		for _, p := range im.host {
			if _, err := os.Stat(p); err != nil {
				missingHost = append(missingHost, p)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s (run make testenv to build them)", strings.Join(missing, ", "))
	}
	if len(missingHost) > 0 {
		return fmt.Errorf("missing %s on this machine (make test-deps installs the packages that hold them)", strings.Join(missingHost, ", "))
	}
	return checkStaticBusybox(busybox)
}

// checkStaticBusybox refuses a busybox that is not a static ELF binary: the images hold no
// libc, and Debian's dynamic busybox package installs /bin/busybox too.
func checkStaticBusybox(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("busybox %s: %w (apt-get install busybox-static)", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("busybox %s is dynamically linked; the images need a static one (apt-get install busybox-static)", p)
		}
	}
	return nil
}

// busyboxApplets runs busybox --list and returns the applet names, sorted.
func busyboxApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	seen := map[string]bool{}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") || seen[a] {
			continue
		}
		seen[a] = true
		applets = append(applets, a)
	}
	if len(applets) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", busybox)
	}
	sort.Strings(applets)
	return applets, nil
}

// entry is one file, directory or symlink in a layer.
type entry struct {
	typ    byte
	mode   int64
	data   []byte
	target string // symlink target
	uid    int    // owner (uid and gid alike); 0 is root
}

// build assembles the image: one layer, then a config naming the platform, entrypoint, cmd
// and environment.
func (im image) build(binDir, busybox string, applets []string) (v1.Image, error) {
	entries := map[string]entry{
		"etc/":       {typ: tar.TypeDir, mode: 0o755},
		"tmp/":       {typ: tar.TypeDir, mode: 0o1777},
		"etc/passwd": {typ: tar.TypeReg, mode: 0o644, data: []byte(passwd + im.passwd)},
		"etc/group":  {typ: tar.TypeReg, mode: 0o644, data: []byte(group + im.group)},
	}
	if err := addHost(entries, im.host, im.skip); err != nil {
		return nil, err
	}
	for p, d := range im.dirs {
		entries[strings.TrimPrefix(p, "/")+"/"] = entry{typ: tar.TypeDir, mode: d.mode, uid: d.uid}
	}
	for p, target := range im.links {
		entries[strings.TrimPrefix(p, "/")] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
	}
	for p, content := range im.scripts {
		entries[strings.TrimPrefix(p, "/")] = entry{typ: tar.TypeReg, mode: 0o755, data: []byte(content)}
	}
	for _, b := range im.bins {
		data, err := os.ReadFile(filepath.Join(binDir, b.bin))
		if err != nil {
			return nil, err
		}
		entries[strings.TrimPrefix(b.path, "/")] = entry{typ: tar.TypeReg, mode: 0o755, data: data}
	}
	for p, content := range im.files {
		entries[strings.TrimPrefix(p, "/")] = entry{typ: tar.TypeReg, mode: 0o644, data: []byte(content)}
	}
	if im.busybox {
		data, err := os.ReadFile(busybox)
		if err != nil {
			return nil, err
		}
		entries["bin/busybox"] = entry{typ: tar.TypeReg, mode: 0o755, data: data}
		for _, a := range applets {
			entries["bin/"+a] = entry{typ: tar.TypeSymlink, mode: 0o777, target: "busybox"}
		}
	}
	layerTar, err := layerTar(entries)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "kip test/images",
			Comment:   "test-lab stand-in for " + im.ref,
		},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = runtime.GOARCH
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = im.entrypoint
	cfg.Config.Cmd = im.cmd
	cfg.Config.Env = im.env
	cfg.Config.StopSignal = im.stopSignal
	cfg.Config.ExposedPorts = nameSet(im.ports)
	cfg.Config.Volumes = nameSet(im.volumes)
	return mutate.ConfigFile(img, cfg)
}

// nameSet is a config's set of names (ExposedPorts, Volumes), nil when there are none.
func nameSet(names []string) map[string]struct{} {
	if len(names) == 0 {
		return nil
	}
	m := map[string]struct{}{}
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// addHost adds the host paths (files and directory trees, less skip) to entries at the same
// paths, and the shared libraries ldd lists for the dynamically linked ELF files among them.
func addHost(entries map[string]entry, paths, skip []string) error {
	skipped := map[string]bool{}
	for _, p := range skip {
		skipped[p] = true
	}
	var dynamic []string
	for _, root := range paths {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if skipped[p] {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			name := strings.TrimPrefix(p, "/")
			mode := tarMode(fi.Mode())
			switch {
			case fi.IsDir():
				entries[name+"/"] = entry{typ: tar.TypeDir, mode: mode}
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				entries[name] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
			case fi.Mode().IsRegular():
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				entries[name] = entry{typ: tar.TypeReg, mode: mode, data: data}
				if isDynamicELF(data) {
					dynamic = append(dynamic, p)
				}
			default:
				return fmt.Errorf("%s: neither a file, a directory nor a symlink", p)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	libs, err := sharedLibraries(dynamic)
	if err != nil {
		return err
	}
	for _, p := range libs {
		// ldd's path may be a symlink (libpq.so.5 → libpq.so.5.15): the image holds the file
		// under the name the loader looks for.
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		entries[strings.TrimPrefix(p, "/")] = entry{typ: tar.TypeReg, mode: tarMode(fi.Mode()), data: data}
	}
	return nil
}

// tarMode is a file mode's permission, set-id and sticky bits as a tar header's mode.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// isDynamicELF reports whether data is an ELF file with a dynamic section: a dynamically linked
// program or a shared library.
func isDynamicELF(data []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_DYNAMIC {
			return true
		}
	}
	return false
}

// sharedLibraries runs ldd on files and returns the absolute paths it lists (each library's
// resolved path and the dynamic loader), sorted; a library ldd does not find is an error.
func sharedLibraries(files []string) ([]string, error) {
	if len(files) == 0 {
		return nil, nil
	}
	cmd := exec.Command("ldd", files...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ldd: %w\n%s", err, stderr.Bytes())
	}
	seen := map[string]bool{}
	var libs, notFound []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || !strings.HasPrefix(line, "\t"):
			// a file's name (ldd of several files), or nothing
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			notFound = append(notFound, f[0])
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			seen[f[2]] = true
		case strings.HasPrefix(f[0], "/"):
			seen[f[0]] = true // the dynamic loader
		}
	}
	if len(notFound) > 0 {
		sort.Strings(notFound)
		return nil, fmt.Errorf("ldd found no %s", strings.Join(slices.Compact(notFound), ", "))
	}
	for p := range seen {
		libs = append(libs, p)
	}
	if len(libs) == 0 {
		return nil, errors.New("ldd listed no shared library")
	}
	sort.Strings(libs)
	return libs, nil
}

// layerTar writes entries, and the parent directories they need, as a tar owned by root with
// a fixed mtime, in sorted order.
func layerTar(entries map[string]entry) ([]byte, error) {
	for p := range entries {
		for d := path.Dir(strings.TrimSuffix(p, "/")); d != "."; d = path.Dir(d) {
			if _, ok := entries[d+"/"]; !ok {
				entries[d+"/"] = entry{typ: tar.TypeDir, mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		e := entries[p]
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     p,
			Linkname: e.target,
			Mode:     e.mode,
			Size:     int64(len(e.data)),
			ModTime:  epoch,
			Uid:      e.uid,
			Gid:      e.uid,
		}
		if e.uid == 0 {
			hdr.Uname, hdr.Gname = "root", "root"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes img tagged ref as a docker-save style tarball at p, atomically.
func writeArchive(p, ref string, img v1.Image) (err error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return err
	}
	tmpName := tmp.Name()
	defer func() {
		if err != nil {
			os.Remove(tmpName)
		}
	}()
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := tarball.WriteToFile(tmpName, tag, img); err != nil {
		return err
	}
	if err := os.Chmod(tmpName, 0o644); err != nil {
		return err
	}
	return os.Rename(tmpName, p)
}
