//go:build kipfault

package workflow_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/workflow"
	"kipper.run/kip/test/testenv"
)

// The helper process: the test binary run again with these set runs the demo workflow against
// the parent's API server, with workflow.FaultEnv naming the point where the runner kills it.
const (
	helperKubeconfig = "KIP_WORKFLOW_HELPER_KUBECONFIG"
	helperNamespace  = "KIP_WORKFLOW_HELPER_NAMESPACE"
)

func init() {
	asHelper = func() {
		kubeconfig := os.Getenv(helperKubeconfig)
		if kubeconfig == "" {
			return
		}
		if err := helperProcess(kubeconfig); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// helperProcess is the helper's whole run. The runner kills it at the fault point; it returns
// only when the run failed or ended without reaching that point.
func helperProcess(kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400 // as the parent's: client-go's default 5/s would starve the lock's renewals
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := os.Getenv(helperNamespace)
	if err := newRunner(client, dyn, ns, kube.HolderText("kip demo"), os.Stderr).Run(context.Background(), newDemo(client, ns).workflow()); err != nil {
		return err
	}
	if os.Getenv(workflow.FaultEnv) == "" {
		return nil // a paused run goes on to the end
	}
	return fmt.Errorf("the run ended without reaching %s", os.Getenv(workflow.FaultEnv))
}

// killPoints are the demo's step boundaries, as the runner's fault points: for every step,
// before (its intent recorded, Apply not started), after (its change made, its progress record
// not written) and done (its record written: the next step's check comes next; after the last
// step, the finished record is written).
func killPoints() []string {
	var points []string
	for _, step := range demoSteps {
		points = append(points, "before:"+step, "after:"+step, "done:"+step)
	}
	return points
}

// resumesAt is the step a run killed at point resumes from, "" when the killed run finished.
func resumesAt(point string) string {
	kind, step, _ := strings.Cut(point, ":")
	if kind != "done" {
		return step // the step being applied
	}
	for i, s := range demoSteps[:len(demoSteps)-1] {
		if s == step {
			return demoSteps[i+1]
		}
	}
	return ""
}

// TestKilledRunResumes kills a run (SIGKILL, by the runner's own fault points) at every step
// boundary and runs the workflow again: the second run takes over the dead run's lock, resumes,
// and ends exactly where an uninterrupted run does, with every step's change made once.
func TestKilledRunResumes(t *testing.T) {
	env := testenv.Get(t)
	client, dyn := clients(t, env.Config)

	reference := env.Namespace(t)
	if err := newRunner(client, dyn, reference, testHolder, &bytes.Buffer{}).Run(t.Context(), newDemo(client, reference).workflow()); err != nil {
		t.Fatal(err)
	}
	want := state(t, client, reference)
	wantProgress, _ := progress(t, dyn, reference)
	if !equalState(want, finalState) {
		t.Fatalf("uninterrupted run left %v", want)
	}

	for _, point := range killPoints() {
		t.Run(strings.ReplaceAll(point, ":", "-"), func(t *testing.T) {
			ns := env.Namespace(t)
			pid := runUntilKilled(t, env, ns, point)

			var out bytes.Buffer
			// The dead run was a process on this machine: its lock is taken over at once.
			if err := newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), newDemo(client, ns).workflow()); err != nil {
				t.Fatalf("run after the kill: %v\n%s", err, out.String())
			}

			if got := state(t, client, ns); !equalState(got, want) {
				t.Errorf("end state:\n got %v\nwant %v\n%s", got, want, out.String())
			}
			p, _ := progress(t, dyn, ns)
			if p.Status != wantProgress.Status || string(p.Intent) != string(wantProgress.Intent) || p.FinishedAt == nil {
				t.Errorf("progress = %+v, want it finished like %+v", p, wantProgress)
			}
			wantOut := []string{
				"! Took over the cluster lock from kip demo by ",
				fmt.Sprintf("pid %d: its process no longer runs\n", pid),
			}
			if step := resumesAt(point); step != "" {
				wantOut = append(wantOut, "Resuming demo from step "+title(step)+" (started ")
			} else if strings.Contains(out.String(), "Resuming") || !strings.Contains(out.String(), "already") {
				t.Errorf("run after a finished run printed:\n%s", out.String())
			}
			for _, s := range wantOut {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, out.String())
				}
			}
			assertLockFree(t, client, ns)
		})
	}
}

func title(step string) string {
	for _, s := range newDemo(nil, "").workflow().Steps {
		if s.Name == step {
			return s.Title
		}
	}
	return step
}

// runUntilKilled runs the helper process with the fault point set, checks that the runner
// killed it there with SIGKILL, and returns its pid.
func runUntilKilled(t *testing.T, env *testenv.Env, ns, point string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), helperKubeconfig+"="+env.KubeconfigPath, helperNamespace+"="+ns, workflow.FaultEnv+"="+point)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("helper did not reach %s in a minute:\n%s", point, output.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("helper: %v, want it killed at %s:\n%s", err, point, output.String())
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want SIGKILL at %s:\n%s", err, point, output.String())
	}
	if !strings.Contains(output.String(), "kipfault: SIGKILL at "+point+" ") {
		t.Fatalf("helper was killed, but not at %s:\n%s", point, output.String())
	}
	return cmd.Process.Pid
}

// TestPausedRunWaits pauses a run before a step: the step's intent is recorded and nothing of it
// is done for as long as the pause file stays, however long the test takes, and the run ends as
// an uninterrupted one once the file is removed.
func TestPausedRunWaits(t *testing.T) {
	env := testenv.Get(t)
	client, dyn := clients(t, env.Config)
	ns := env.Namespace(t)
	file := filepath.Join(t.TempDir(), "paused")
	cmd := exec.CommandContext(t.Context(), os.Args[0])
	cmd.Env = append(os.Environ(), helperKubeconfig+"="+env.KubeconfigPath, helperNamespace+"="+ns,
		workflow.PauseEnv+"=before:scale-app", workflow.PauseFileEnv+"="+file)
	var output bytes.Buffer // read only once the process ended
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := waitForFile(file, done); err != nil {
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v:\n%s", err, output.String())
	}
	if pid, err := os.ReadFile(file); err != nil || string(pid) != strconv.Itoa(cmd.Process.Pid) {
		t.Errorf("pause file holds %q (%v), want the pid %d", pid, err, cmd.Process.Pid)
	}
	// Paused: the step's intent is recorded and the step has not run.
	p, _ := progress(t, dyn, ns)
	if p.Status != workflow.StatusApplying || p.Step != "scale-app" {
		t.Errorf("progress while paused = %+v, want applying scale-app", p)
	}
	if got := state(t, client, ns)["app"]["replicas"]; got != "1" {
		t.Errorf("replicas while paused = %q, want 1", got)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the run after the pause: %v\n%s", err, output.String())
	}
	if !strings.Contains(output.String(), "kipfault: paused at before:scale-app (step scale-app) until "+file+" is removed") {
		t.Errorf("paused run printed:\n%s", output.String())
	}
	assertFinished(t, client, dyn, ns, finalState)
}

// waitForFile waits until file exists; it fails when the process ends first (done) or has not
// paused within a minute.
func waitForFile(file string, done <-chan error) error {
	deadline := time.After(time.Minute)
	for {
		if _, err := os.Stat(file); err == nil {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("the run ended (%v) before it paused", err)
		case <-deadline:
			return errors.New("the run did not pause within a minute")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
