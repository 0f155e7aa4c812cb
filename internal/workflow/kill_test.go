package workflow_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/testenv"
)

// The helper process: the test binary run again with these set runs the demo workflow against
// the parent's API server, prints "at <point>" on stdout when it reaches the kill point and waits
// there to be killed.
const (
	helperKubeconfig = "KIP_WORKFLOW_HELPER_KUBECONFIG"
	helperNamespace  = "KIP_WORKFLOW_HELPER_NAMESPACE"
	helperKillAt     = "KIP_WORKFLOW_HELPER_KILL_AT"
	// finishedPoint is after Run returned: the finished record written, the lock released.
	finishedPoint = "finished"
)

// helperProcess is the helper's whole run: it returns only when the run failed or never
// reached the kill point, and otherwise waits there to be killed.
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
	ns, point := os.Getenv(helperNamespace), os.Getenv(helperKillAt)
	waitToBeKilled := func() {
		fmt.Printf("at %s\n", point)
		time.Sleep(time.Hour)
	}
	d := newDemo(client, ns)
	d.hook = func(at string) {
		if at == point {
			waitToBeKilled()
		}
	}
	if err := newRunner(client, dyn, ns, kube.HolderText("kip demo"), os.Stderr).Run(context.Background(), d.workflow()); err != nil {
		return err
	}
	if point == finishedPoint {
		waitToBeKilled()
	}
	return fmt.Errorf("the run never reached %s", point)
}

// killPoints are the demo's step boundaries: for every step, after its intent record (Apply
// started), after its change but before its progress record, and after that record (the next
// step's first check; for the last step, the finished record).
func killPoints() []string {
	var points []string
	for i, step := range demoSteps {
		next := finishedPoint
		if i+1 < len(demoSteps) {
			next = "check:" + demoSteps[i+1]
		}
		points = append(points, "apply:"+step, "applied:"+step, next)
	}
	return points
}

// TestKilledRunResumes kills a run (SIGKILL) at every step boundary and runs the workflow again:
// the second run waits out the dead run's lock, takes it over, resumes, and ends exactly where an
// uninterrupted run does, with every step's change made once.
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
			run := func() error {
				return newRunner(client, dyn, ns, testHolder, &out).Run(t.Context(), newDemo(client, ns).workflow())
			}
			// The dead run was a process on this machine: its lock is taken over at once.
			err := run()
			deadHolder := fmt.Sprintf("pid %d", pid)
			if err != nil {
				t.Fatalf("run after the kill: %v\n%s", err, out.String())
			}

			if got := state(t, client, ns); !equalState(got, want) {
				t.Errorf("end state:\n got %v\nwant %v\n%s", got, want, out.String())
			}
			p, _ := progress(t, dyn, ns)
			if p.Status != wantProgress.Status || string(p.Intent) != string(wantProgress.Intent) || p.FinishedAt == nil {
				t.Errorf("progress = %+v, want it finished like %+v", p, wantProgress)
			}
			if point == finishedPoint {
				if !strings.Contains(out.String(), "already") || strings.Contains(out.String(), "Resuming") {
					t.Errorf("run after a finished run printed:\n%s", out.String())
				}
				return
			}
			_, resumeAt, _ := strings.Cut(point, ":") // the step being applied, or the next one
			wantOut := []string{
				"! Took over the cluster lock from kip demo by ",
				deadHolder + ": its process no longer runs\n",
				"Resuming demo from step " + title(resumeAt) + " (started ",
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

// runUntilKilled starts the helper process, waits for it to reach point, SIGKILLs it and
// returns its pid.
func runUntilKilled(t *testing.T, env *testenv.Env, ns, point string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperKubeconfig+"="+env.KubeconfigPath, helperNamespace+"="+ns, helperKillAt+"="+point)
	var output bytes.Buffer // stderr, and stdout as far as it was read
	cmd.Stderr = &output
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reached := make(chan bool, 1)
	var read []string
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if lines.Text() == "at "+point {
				reached <- true
				return
			}
			read = append(read, lines.Text())
		}
		reached <- false
	}()
	select {
	case ok := <-reached:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("helper exited before %s:\n%s%s", point, output.String(), strings.Join(read, "\n"))
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper did not reach %s in a minute:\n%s", point, output.String())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return cmd.Process.Pid
}
