// Command longhorn-standin is the test lab's stand-in for Longhorn's CSI plugin, never part of
// kip (docs/longhorn-standin.md): it serves driver.longhorn.io on one lab node to the real CSI
// sidecars and the kubelet, with volumes that are real ext4 file systems in image files under
// /var/lib/longhorn, and keeps Longhorn's objects (Volume, Replica, Engine, VolumeAttachment,
// Node, Setting, EngineImage) as Longhorn's manager would for them.
//
//	longhorn-standin -node NAME [-controller] [-kubeconfig FILE] [-crds FILE]   serve
//	longhorn-standin cleanup                                       unmount and detach every volume
//	longhorn-standin manager -node NAME -version V [-kubeconfig FILE]   the manager of a release (package manager)
//	longhorn-standin instance-manager                              an instance manager's pod: waits for SIGTERM
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	lhclient "github.com/longhorn/longhorn-manager/k8s/pkg/client/clientset/versioned"
	"google.golang.org/grpc"
	apiextensionsclientset "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"kipper.run/kip/test/longhorn-standin/loop"
	"kipper.run/kip/test/longhorn-standin/manager"
)

const (
	// dataPath is Longhorn's default data path, its default disk.
	dataPath = "/var/lib/longhorn"
	// pluginDir is where the kubelet finds driver.longhorn.io's socket, as Longhorn's deployment
	// puts it.
	pluginDir = "/var/lib/kubelet/plugins/" + driverName
	// registryDir is the kubelet's plugin watcher's directory.
	registryDir = "/var/lib/kubelet/plugins_registry"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) > 1 && os.Args[1] == "cleanup" {
		if err := cleanup(); err != nil {
			log.Fatalf("longhorn-standin: cleanup: %v", err)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "instance-manager" {
		// An instance manager's pod: it holds its CPU request on the node and runs no process.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		<-ctx.Done()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "manager" {
		if err := runManager(os.Args[2:]); err != nil {
			log.Fatalf("longhorn-standin manager: %v", err)
		}
		return
	}
	node := flag.String("node", "", "this node's Kubernetes name")
	kubeconfig := flag.String("kubeconfig", "/etc/rancher/k3s/k3s.yaml", "kubeconfig of the cluster")
	crds := flag.String("crds", "", "Longhorn's crds.yaml, whose CRDs the stand-in needs it installs")
	controller := flag.Bool("controller", false, "also do what Longhorn's managers do for the whole cluster (evict copies from cordoned nodes): on the node the CSI sidecars serve")
	flag.Parse()
	if *node == "" {
		log.Fatal("longhorn-standin: -node is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, *node, *controller, *kubeconfig, *crds); err != nil {
		log.Fatalf("longhorn-standin: %v", err)
	}
}

// clients are the API's clients with kubeconfig's credentials, in-cluster ones when it is "".
func clients(kubeconfig string) (*rest.Config, kubernetes.Interface, lhclient.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	lhc, err := lhclient.NewForConfig(cfg)
	return cfg, kube, lhc, err
}

func serve(ctx context.Context, node string, controller bool, kubeconfig, crdsFile string) error {
	cfg, kube, lhc, err := clients(kubeconfig)
	if err != nil {
		return err
	}
	if crdsFile != "" {
		data, err := os.ReadFile(crdsFile)
		if err != nil {
			return err
		}
		apiext, err := apiextensionsclientset.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if err := installCRDs(ctx, apiext, data); err != nil {
			return err
		}
	}
	s := &store{lh: lhc, kube: kube, node: node, controller: controller, root: dataPath, exported: map[string]*loop.Device{}}
	if err := s.setUp(ctx); err != nil {
		return fmt.Errorf("set up Longhorn's objects: %w", err)
	}
	p := &plugin{s: s}

	sock := filepath.Join(pluginDir, "csi.sock")
	csiServer, err := listen(sock)
	if err != nil {
		return err
	}
	csi.RegisterIdentityServer(csiServer.srv, p)
	csi.RegisterControllerServer(csiServer.srv, p)
	csi.RegisterNodeServer(csiServer.srv, p)
	go csiServer.serve()
	defer csiServer.stop()

	// What node-driver-registrar does beside Longhorn's plugin: a registration socket in the
	// kubelet's plugin watcher directory, telling the kubelet the plugin's name and endpoint.
	reg, err := listen(filepath.Join(registryDir, driverName+"-reg.sock"))
	if err != nil {
		return err
	}
	registerapi.RegisterRegistrationServer(reg.srv, &registration{endpoint: sock})
	go reg.serve()
	defer reg.stop()
	log.Printf("longhorn-standin: serving %s on %s for node %s", driverName, sock, node)

	wait.UntilWithContext(ctx, func(ctx context.Context) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
			log.Printf("longhorn-standin: reconcile: %v", err)
		}
	}, time.Second)
	return nil
}

// runManager is the stand-in's longhorn-manager, as the lab's longhorn-manager DaemonSet runs it
// in a pod on each node (in-cluster credentials unless -kubeconfig): it starts as its release's
// manager does, ending with Longhorn's error on an upgrade path Longhorn refuses, then keeps its
// node's part every second.
func runManager(args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	node := fs.String("node", "", "this node's Kubernetes name")
	version := fs.String("version", "", "the Longhorn release this manager is: v1.8.2")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster; in-cluster credentials when empty")
	serviceAccount := fs.String("service-account", "", "the service account of the instance manager pods")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rel, err := manager.Find(*version)
	if err != nil {
		return err
	}
	if *node == "" {
		return errors.New("-node is required")
	}
	_, kube, lhc, err := clients(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m := &manager.Manager{Kube: kube, LH: lhc, Node: *node, Release: rel, ServiceAccount: *serviceAccount}
	log.Printf("Checking if the upgrade path to %v is supported", rel.Version)
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("failed to start the manager: %w", err)
	}
	log.Printf("longhorn-manager %s started on node %s", rel.Version, *node)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := m.Reconcile(ctx); err != nil && ctx.Err() == nil {
			log.Printf("reconcile: %v", err)
		}
	}, time.Second)
	return nil
}

type server struct {
	srv  *grpc.Server
	lis  net.Listener
	path string
}

// listen makes a gRPC server on a new Unix socket at path (one left by an earlier run removed).
func listen(path string) (*server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	return &server{srv: grpc.NewServer(grpc.UnaryInterceptor(logFailure)), lis: lis, path: path}, nil
}

// logFailure logs each call that fails, so that the plugin's journal tells what the CSI
// sidecars and the kubelet only retry.
func logFailure(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		log.Printf("longhorn-standin: %s: %v", info.FullMethod, err)
	}
	return resp, err
}

func (s *server) serve() {
	if err := s.srv.Serve(s.lis); err != nil {
		log.Printf("longhorn-standin: %s: %v", s.path, err)
	}
}

func (s *server) stop() {
	s.srv.Stop()
	os.Remove(s.path) //nolint:errcheck // the kubelet sees the plugin go
}

// registration answers the kubelet's plugin watcher, as node-driver-registrar does.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: driverName, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Printf("longhorn-standin: the kubelet refused the registration: %s", st.Error)
	} else {
		log.Printf("longhorn-standin: registered with the kubelet")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// cleanup unmounts every volume's file system and detaches its loop device, as when the plugin
// stops: the stand-in's unit runs it after the plugin ends (ExecStopPost).
func cleanup() error {
	imgs, err := filepath.Glob(filepath.Join(dataPath, "replicas", "*", "volume.img"))
	if err != nil {
		return err
	}
	var errs []error
	for _, img := range imgs {
		errs = append(errs, release(img))
	}
	return errors.Join(errs...)
}
