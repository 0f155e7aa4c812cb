package controlplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
)

// CheckTimeout limits each call of a Poll check.
const CheckTimeout = 2 * time.Second

// Poll calls check, every interval, until it returns nil; then Poll returns nil. Each call gets a
// context limited to CheckTimeout. Poll gives up when failed is closed (say a process the check
// waits for has ended), returning failure(), or when ctx ends, returning an error that wraps
// ctx.Err() and gives check's last error.
func Poll(ctx context.Context, interval time.Duration, failed <-chan struct{}, failure func() error, check func(context.Context) error) error {
	for {
		select {
		case <-failed:
			return failure()
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, CheckTimeout)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)
		case <-failed:
			return failure()
		case <-time.After(interval):
		}
	}
}

// HTTPOK checks that url answers 200 OK with a body whose first 4 KiB contain want.
func HTTPOK(ctx context.Context, client *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// APIServerReady checks that kube-apiserver's /readyz answers OK. Its error gives the answer's
// body, which lists the checks that failed, when there is one.
func APIServerReady(ctx context.Context, kube kubernetes.Interface) error {
	body, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err == nil {
		return nil
	}
	if b := strings.TrimSpace(string(body)); b != "" {
		return fmt.Errorf("/readyz: %s", b)
	}
	return err
}
