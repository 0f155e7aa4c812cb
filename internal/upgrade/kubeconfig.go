package upgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/internal/config"
	"kipper.run/kip/internal/k3s"
)

// reachTimeout bounds the request that proves the server's admin kubeconfig reaches the API.
const reachTimeout = 20 * time.Second

// refreshKubeconfig reconciles the cluster CA that kip trusts and the admin certificate it
// presents with the server's, over SSH, before the upgrade first reaches the API (spec 002:
// the cluster CA is reconciled on every upgrade, even with --skip-system). k3s renews its admin
// certificate when it starts near its expiry and rotating the CA changes both, so a copy kip
// never refreshed stops working within a year. The server's admin kubeconfig, as install saves
// it, replaces the saved one only once it reaches the API at the saved address, which proves it
// belongs to this cluster; otherwise kip keeps its own and says so.
func refreshKubeconfig(ctx context.Context, o *Options) error {
	s := o.Saved
	if o.Dial == nil || s == nil || s.Kubeconfig == "" {
		return nil
	}
	o.Printer.Info(fmt.Sprintf("Checking the cluster CA and kip's admin certificate against the server's over SSH (%s)", s.Host))
	c, err := o.Dial(ctx, s.Host)
	if err != nil {
		return fmt.Errorf("kip upgrade reaches the server over SSH on every upgrade, even with --skip-system (the cluster CA and the API server's arguments live there): %w", err)
	}
	server, err := k3s.AdminKubeconfig(ctx, c, s.Name, c.Host())
	if err != nil {
		return err
	}
	saved, err := os.ReadFile(s.Kubeconfig)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read the saved kubeconfig: %w", err)
	}
	if what := k3s.KubeconfigChange(saved, server); what != "" {
		if err := reachAPI(ctx, server); err != nil {
			o.Printer.Warn(fmt.Sprintf("The server's admin kubeconfig (%s) differs from the one kip saved at %s (%s), but it does not reach the API: %v. kip keeps its own", k3s.KubeconfigPath, s.Kubeconfig, what, err))
		} else {
			if err := config.WriteFileAtomic(s.Kubeconfig, server, 0o600); err != nil {
				return fmt.Errorf("save the server's admin kubeconfig: %w", err)
			}
			o.Printer.Success(fmt.Sprintf("The kubeconfig saved at %s brought up to date with the server's: %s changed", s.Kubeconfig, what))
			saved = server
		}
	}
	if warn := k3s.AdminCertWarning(saved, time.Now()); warn != "" {
		o.Printer.Warn(warn)
	}
	return nil
}

// reachAPI makes one request that needs the admin's credentials through kubeconfig.
func reachAPI(ctx context.Context, kubeconfig []byte) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = reachTimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	return err
}
