// Package manager is the Longhorn stand-in's manager: what Longhorn's longhorn-manager does as
// each of the releases kip's Longhorn ladder names, for the objects kip reads. It refuses an
// upgrade path Longhorn refuses, records its release in the settings, deploys its engine image
// (named and reference-counted as Longhorn does), runs an instance manager on its node as a real
// pod with Longhorn's CPU request, removes an older instance manager once no engine runs in it,
// and from 1.10 refuses to delete an engine image in use. The lab runs it in the pods of the
// longhorn-manager DaemonSet (longhorn-standin manager); the plugin uses its release table and
// settings. See docs/longhorn-standin.md.
//
// Its numbers are Longhorn's, from shared research (LM = longhorn/longhorn-manager at each
// release tag), not kip's: a wrong rule in kip must fail against it.
package manager

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"strings"

	lh "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	"golang.org/x/mod/semver"
)

// Namespace is Longhorn's.
const Namespace = "longhorn-system"

// Release is what the stand-in models of one Longhorn release.
type Release struct {
	// Version is the release, as current-longhorn-version holds it: v1.8.2.
	Version string
	// The engine's CLI and controller API versions and the oldest each drives (LM
	// vendor/github.com/longhorn/longhorn-engine/pkg/meta/version.go).
	CLIAPI, CLIAPIMin, ControllerAPI, ControllerAPIMin int
	// PerEngine: data-engine-specific settings hold a JSON object per data engine (1.10 on).
	PerEngine bool
	// GuardsEngineImages: a webhook refuses to delete an engine image in use or the default one
	// (1.10 on; LM webhook/resources/engineimage/validator.go).
	GuardsEngineImages bool
	// V1beta1 is how the release's CRDs list longhorn.io/v1beta1: V1beta1Served (to 1.8),
	// V1beta1Unserved (1.9), or "" (gone from 1.10).
	V1beta1 string
}

// How a release's CRDs list longhorn.io/v1beta1.
const (
	V1beta1Served   = "served"
	V1beta1Unserved = "unserved"
)

// Releases are the releases of kip's Longhorn ladder, oldest first.
var Releases = []Release{
	{Version: "v1.7.3", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Served},
	{Version: "v1.8.2", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Served},
	{Version: "v1.9.2", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, V1beta1: V1beta1Unserved},
	{Version: "v1.10.2", CLIAPI: 10, CLIAPIMin: 8, ControllerAPI: 5, ControllerAPIMin: 4, PerEngine: true, GuardsEngineImages: true},
	{Version: "v1.11.3", CLIAPI: 11, CLIAPIMin: 8, ControllerAPI: 6, ControllerAPIMin: 4, PerEngine: true, GuardsEngineImages: true},
}

// Newest is the release a cluster whose manager never recorded one is taken to run: the one kip
// installs.
var Newest = Releases[len(Releases)-1]

// Find is the release version names.
func Find(version string) (Release, error) {
	for _, r := range Releases {
		if r.Version == version {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("the Longhorn stand-in models no release %q", version)
}

// EngineImage, InstanceManagerImage and ManagerImage are the release's images, as its chart names them.
func (r Release) EngineImage() string { return "longhornio/longhorn-engine:" + r.Version }
func (r Release) InstanceManagerImage() string {
	return "longhornio/longhorn-instance-manager:" + r.Version
}
func (r Release) ManagerImage() string { return "longhornio/longhorn-manager:" + r.Version }

// checksum is Longhorn's util.GetStringChecksum: SHA-512, in hex.
func checksum(s string) string {
	sum := sha512.Sum512([]byte(s))
	return hex.EncodeToString(sum[:])
}

// EngineImageName is the name of image's EngineImage (LM types.GetEngineImageChecksumName).
func EngineImageName(image string) string {
	return "ei-" + checksum(strings.TrimSpace(image))[:8]
}

// InstanceManagerName is the name of the v1 instance manager of image on node, and of its pod
// (LM types.GetInstanceManagerName, the all-in-one type).
func InstanceManagerName(node, image string) string {
	return "instance-manager-" + checksum(node + image + string(lh.DataEngineTypeV1))[:32]
}

// InstanceManagerImageLabel is the value of an instance manager pod's
// longhorn.io/instance-manager-image label (LM types.GetInstanceManagerLabels: the checksum of
// the image's canonical name).
func InstanceManagerImageLabel(image string) string {
	canonical := strings.ReplaceAll(strings.ReplaceAll(image, ":", "-"), "/", "-")
	return "imi-" + checksum(strings.TrimSpace(canonical))[:8]
}

// CheckUpgradePath is Longhorn's CheckUpgradePath (LM upgrade/util/util.go), with its messages:
// from current (current-longhorn-version, "" on a new cluster) to next, at most one minor up and
// never down; and every engine image in use (refCount not 0) driven by next's engine.
func CheckUpgradePath(current string, next Release, images []lh.EngineImage) error {
	if current != "" {
		cur, nxt := minor(current), minor(next.Version)
		switch {
		case semver.Major(current) != semver.Major(next.Version):
			return fmt.Errorf("failed to upgrade since upgrading from %v to %v for major version is not supported", current, next.Version)
		case nxt-cur > 1:
			return fmt.Errorf("failed to upgrade since upgrading from %v to %v for minor version is not supported", current, next.Version)
		case nxt-cur < 1 && semver.Compare(current, next.Version) > 0:
			return fmt.Errorf("failed to upgrade since downgrading from %v to %v is not supported", current, next.Version)
		}
	}
	check := func(cur, newest, oldest int) error {
		if cur > newest {
			return fmt.Errorf("downgrading from %v to %v is not supported", cur, newest)
		}
		if cur < oldest {
			return fmt.Errorf("found version %v is below required minimal version %v", cur, oldest)
		}
		return nil
	}
	for _, ei := range images {
		if ei.Status.RefCount == 0 {
			continue
		}
		if err := check(ei.Status.ControllerAPIVersion, next.ControllerAPI, next.ControllerAPIMin); err != nil {
			return fmt.Errorf("failed checking Engine upgrade path: incompatible Engine %v controller API version: %w", ei.Name, err)
		}
		if err := check(ei.Status.CLIAPIVersion, next.CLIAPI, next.CLIAPIMin); err != nil {
			return fmt.Errorf("failed checking Engine upgrade path: incompatible Engine %v client API version: %w", ei.Name, err)
		}
	}
	return nil
}

// minor is a version's minor number (v1.9.2: 9).
func minor(v string) int {
	var major, minor int
	fmt.Sscanf(strings.TrimPrefix(semver.MajorMinor(v), "v"), "%d.%d", &major, &minor)
	return minor
}
