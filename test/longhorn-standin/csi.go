package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kipper.run/kip/test/longhorn-standin/loop"
)

// version is the Longhorn release the stand-in answers as.
const version = "v1.10.0"

// plugin serves CSI's Identity, Controller and Node services for driver.longhorn.io on one node.
// Requests are served one at a time: the stand-in's volumes are few and its operations short.
type plugin struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	s  *store
	mu sync.Mutex
}

// grpcError maps the stand-in's errors to CSI's codes.
func grpcError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNoRoom):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errBusy):
		return status.Error(codes.FailedPrecondition, err.Error())
	case apierrors.IsNotFound(err):
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func (p *plugin) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: version}, nil
}

func (p *plugin) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_OFFLINE}}},
	}}, nil
}

func (p *plugin) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (p *plugin) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// checkCaps accepts what the stand-in serves: single-node file system volumes (ext4).
func checkCaps(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "no volume capability")
	}
	for _, c := range caps {
		if c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "only file system volumes are served")
		}
		if fs := c.GetMount().GetFsType(); fs != "" && fs != "ext4" {
			return status.Errorf(codes.InvalidArgument, "file system %q: only ext4 is served", fs)
		}
		switch c.GetAccessMode().GetMode() {
		case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
			csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		default:
			return status.Errorf(codes.InvalidArgument, "access mode %s: only single-node access is served", c.GetAccessMode().GetMode())
		}
	}
	return nil
}

func (p *plugin) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume name")
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volumes from snapshots or clones are not served")
	}
	size := roundUp(req.GetCapacityRange().GetRequiredBytes())
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "size %d rounded to Longhorn's alignment is over the limit %d", size, limit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	vol, err := p.s.createVolume(ctx, req.GetName(), size, req.GetParameters())
	if err != nil {
		return nil, grpcError(err)
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: vol.Name, CapacityBytes: vol.Spec.Size, VolumeContext: req.GetParameters()}}, nil
}

func (p *plugin) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return &csi.DeleteVolumeResponse{}, grpcError(p.s.deleteVolume(ctx, req.GetVolumeId()))
}

func (p *plugin) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume or node ID")
	}
	if err := checkCaps([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	primary, err := p.s.attach(ctx, req.GetVolumeId(), req.GetNodeId())
	if err != nil {
		return nil, grpcError(err)
	}
	pc := map[string]string{publishCopy: primary.Spec.DataDirectoryName}
	if primary.Spec.NodeID != req.GetNodeId() {
		n, err := p.s.serve(ctx, primary, req.GetNodeId())
		if err != nil {
			return nil, grpcError(err)
		}
		pc[publishLoop] = strconv.Itoa(n)
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// The publish context's keys: the data directory of the copy the engine serves, and, when that
// copy is on another node, the loop device its node serves it on (store.serve).
const (
	publishCopy = "standin.longhorn.io/copy"
	publishLoop = "standin.longhorn.io/loop"
)

func (p *plugin) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return &csi.ControllerUnpublishVolumeResponse{}, grpcError(p.s.detach(ctx, req.GetVolumeId(), req.GetNodeId()))
}

func (p *plugin) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if _, err := p.s.volumes().Get(ctx, req.GetVolumeId(), metav1.GetOptions{}); err != nil {
		return nil, grpcError(err)
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{VolumeCapabilities: req.GetVolumeCapabilities()}}, nil
}

func (p *plugin) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	size := roundUp(req.GetCapacityRange().GetRequiredBytes())
	p.mu.Lock()
	defer p.mu.Unlock()
	got, err := p.s.expand(ctx, req.GetVolumeId(), size)
	if errors.Is(err, errNoRoom) { // Longhorn's CSI answers a scheduling failure on expansion so
		return nil, status.Error(codes.OutOfRange, err.Error())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: got, NodeExpansionRequired: true}, nil
}

func (p *plugin) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (p *plugin) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: p.s.node}, nil
}

// NodeStageVolume binds the volume's image to a loop device of its own and mounts its file system
// at the staging path: a fresh mount, reading the image, after every unstage.
func (p *plugin) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	staging := req.GetStagingTargetPath()
	if req.GetVolumeId() == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID or staging path")
	}
	if err := checkCaps([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if mounted(staging) {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	dir := req.GetPublishContext()[publishCopy]
	if dir == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: the publish context names no copy: publish it again", req.GetVolumeId())
	}
	img := p.s.imageOf(dir)
	if l, ok := req.GetPublishContext()[publishLoop]; ok {
		return &csi.NodeStageVolumeResponse{}, grpcError(stageRemote(l, img, staging))
	}
	if _, err := os.Stat(img); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s has no data on node %s: %v", req.GetVolumeId(), p.s.node, err)
	}
	// A device still bound to the image without the staging mount is left from an interrupted
	// unstage: released first, so that no two devices share the image.
	if err := release(img); err != nil {
		return nil, grpcError(err)
	}
	if err := growFS(ctx, img); err != nil {
		return nil, grpcError(err)
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, grpcError(err)
	}
	dev, err := loop.Attach(img)
	if err != nil {
		return nil, grpcError(err)
	}
	defer dev.Close() // the mount holds it from here on; unmounting it detaches it
	if err := unix.Mount(dev.Path, staging, "ext4", 0, ""); err != nil {
		return nil, grpcError(errors.Join(fmt.Errorf("mount %s at %s: %w", dev.Path, staging, err), dev.Detach()))
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageRemote mounts at staging the loop device l (its number) that another node's plugin bound
// to the copy's image img there (store.serve): the device must still be bound to a file of
// img's path.
func stageRemote(l, img, staging string) error {
	n, err := strconv.Atoi(l)
	if err != nil {
		return fmt.Errorf("publish context %s=%q: %w", publishLoop, l, err)
	}
	if got := loop.Backing(loop.SysBlock)[n]; got != img {
		return fmt.Errorf("%w: loop device %d serves %q, not %s: publish the volume again", errBusy, n, got, img)
	}
	d, err := loop.Open(n)
	if err != nil {
		return err
	}
	defer d.Close() // the mount holds it from here on; its node stays until the unstage
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return err
	}
	if err := unix.Mount(d.Path, staging, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s at %s: %w", d.Path, staging, err)
	}
	return nil
}

// NodeUnstageVolume unmounts the file system and detaches its loop device when it serves an image
// on this node; a device another node's plugin serves (stageRemote) is only unmounted, and that
// plugin detaches it.
func (p *plugin) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	staging := req.GetStagingTargetPath()
	if req.GetVolumeId() == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID or staging path")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if img := p.s.stagedImage(staging); img != "" {
		return &csi.NodeUnstageVolumeResponse{}, grpcError(release(img))
	}
	return &csi.NodeUnstageVolumeResponse{}, grpcError(unmountSource(staging))
}

// stagedImage is the image on this node whose loop device is mounted at staging, "" when none is.
func (s *store) stagedImage(staging string) string {
	n, ok := loop.Number(sourceOf(staging))
	if !ok {
		return ""
	}
	img := loop.Backing(loop.SysBlock)[n]
	if filepath.Dir(filepath.Dir(img)) != filepath.Join(s.root, "replicas") {
		return ""
	}
	if _, err := os.Stat(img); err != nil {
		return ""
	}
	return img
}

// NodePublishVolume bind-mounts the staging path at the pod's path; read-only when the pod asks,
// as Longhorn's node server does (the staging mount stays read-write).
func (p *plugin) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target, staging := req.GetTargetPath(), req.GetStagingTargetPath()
	if req.GetVolumeId() == "" || target == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID, target or staging path")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !mounted(staging) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), staging)
	}
	if mounted(target) {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, grpcError(err)
	}
	if err := unix.Mount(staging, target, "", unix.MS_BIND, ""); err != nil {
		return nil, grpcError(fmt.Errorf("bind %s at %s: %w", staging, target, err))
	}
	if req.GetReadonly() {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return nil, grpcError(errors.Join(fmt.Errorf("remount %s read-only: %w", target, err), unix.Unmount(target, 0)))
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (p *plugin) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if req.GetVolumeId() == "" || target == "" {
		return nil, status.Error(codes.InvalidArgument, "no volume ID or target path")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if mounted(target) {
		if err := unix.Unmount(target, 0); err != nil {
			return nil, grpcError(fmt.Errorf("unmount %s: %w", target, err))
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, grpcError(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeExpandVolume reports the staged file system's size. It grew, offline, when it was staged
// (growFS): the stand-in expands volumes offline only, its capability says so, and the resizer
// waits until no pod uses a claim.
func (p *plugin) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	src := sourceOf(req.GetStagingTargetPath())
	if _, ok := loop.Number(src); !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on node %s", req.GetVolumeId(), p.s.node)
	}
	size, err := fsSize(src)
	if err != nil {
		return nil, grpcError(err)
	}
	if want := req.GetCapacityRange().GetRequiredBytes(); size < want {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s's file system is %d bytes, %d wanted: it grows offline, at its next stage", req.GetVolumeId(), size, want)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

func (p *plugin) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(req.GetVolumePath(), &fs); err != nil {
		return nil, status.Errorf(codes.NotFound, "statfs %s: %v", req.GetVolumePath(), err)
	}
	bs := fs.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}
