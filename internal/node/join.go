package node

import (
	"context"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/components"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/verify"
	"kipper.run/kip/internal/workflow"
)

// Timeouts of a join's waits.
const (
	joinTimeout  = 5 * time.Minute // the node registering Ready, the server's API after its restart
	checkTimeout = 5 * time.Minute // the verification pod, Longhorn's node
)

// hostFile is a file kip writes on a host.
type hostFile struct {
	path string
	data []byte
}

// steps are the join's steps, in order.
func (j *joiner) steps() []workflow.Step {
	steps := []workflow.Step{j.recordStep()}
	if j.fenced != nil {
		steps = append(steps, j.unfenceRebootStep(), j.unfenceAgentStep())
	}
	steps = append(steps, j.holdStep())
	if j.serverMove {
		steps = append(steps, j.serverMoveStep())
	}
	steps = append(steps, j.peerFirewallSteps()...)
	prep := host.Prep{OS: j.nodeFacts.OS, Longhorn: true, WireGuard: true, Sysctls: j.intent.Fresh}
	if j.intent.Firewall {
		prep.Firewall = j.nodeRules()
	}
	steps = append(steps, j.family.PrepSteps(j.node, prep)...)
	if j.fenced != nil {
		steps = append(steps, j.unfenceTaintStep())
	}
	steps = append(steps, j.k3sSteps()...)
	steps = append(steps, j.verifyStep(), j.longhornStep(), j.releaseStep())
	if !j.o.NoCopies {
		steps = append(steps, j.copiesStep())
	}
	steps = append(steps, j.readyStep())
	if j.fenced != nil {
		steps = append(steps, j.unfenceStep())
	}
	return steps
}

// otherAddrs are the addresses on the nodes' network of every node but the new one: the server
// first.
func (j *joiner) otherAddrs() []netip.Addr {
	return append([]netip.Addr{j.intent.Path.Server}, j.nodes.WorkerAddresses(j.intent.Node)...)
}

// nodeRules are the new worker's firewall rules.
func (j *joiner) nodeRules() []host.Rule {
	return host.WorkerFirewall(sshPort(j.node), j.intent.Path.Server, j.otherAddrs())
}

// serverRules are the server's firewall rules with the new worker among its peers.
func (j *joiner) serverRules() []host.Rule {
	return host.ServerFirewall(sshPort(j.server), append(j.nodes.WorkerAddresses(j.intent.Node), j.intent.Path.Node))
}

// peerRules are an existing worker's firewall rules with the new worker among its peers.
func (j *joiner) peerRules(p *peer) []host.Rule {
	n := j.nodes
	n.Server = j.intent.Path.Server
	return host.WorkerFirewall(sshPort(p.c), j.intent.Path.Server, n.PeerAddrs(p.name, j.intent.Node, j.intent.Path.Node))
}

func (j *joiner) recordStep() workflow.Step {
	return workflow.Step{
		Name: "record", Title: "Record worker " + j.intent.Node + " as joining",
		Done: "Recorded worker " + j.intent.Node + " as joining", Already: "Worker " + j.intent.Node + " already recorded by this join",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
			w, ok := n.Workers[j.intent.Node]
			recorded := w.State == cluster.WorkerJoining || w.State == cluster.WorkerReady && w.Join == j.intent.VerifyID
			return ok && recorded && w.Path == j.intent.Path && n.Mode == j.intent.Path.Mode && (!j.o.NoCopies || w.Copies == cluster.CopiesUnchecked), err
		},
		Apply: func(ctx context.Context) error {
			_, err := cluster.UpdateNodes(ctx, j.cl.Dynamic, func(n *cluster.Nodes) error {
				if n.Mode == "" {
					n.Mode, n.Server = j.intent.Path.Mode, j.intent.Path.Server
				}
				w := n.Workers[j.intent.Node]
				w.Host, w.SSHPort, w.SSHUser = j.o.Host, sshPort(j.node), j.node.User()
				w.Path, w.FirewallManaged, w.State, w.Join = j.intent.Path, j.intent.Firewall, cluster.WorkerJoining, j.intent.VerifyID
				if w.Copies == "" || j.o.NoCopies {
					w.Copies = cluster.CopiesUnchecked
				}
				n.Workers[j.intent.Node] = w
				return nil
			})
			return err
		},
	}
}

// holdStep keeps ordinary new workloads off a node that is already in the cluster while kip
// checks it: a rejoin cordons it, leaving its running workloads. A new node registers with the
// joining taint instead.
func (j *joiner) holdStep() workflow.Step {
	return workflow.Step{
		Name: "hold", Title: "Cordon " + j.intent.Node + " for the checks (its running workloads stay)",
		Done: "Cordoned " + j.intent.Node, Already: j.intent.Node + " needs no cordon: it is new or already held",
		Check: func(ctx context.Context) (bool, error) {
			if j.intent.Fresh {
				// A node that was not in the cluster when this join started registers with the
				// joining taint, and its resumed join must not cordon it once the taint is lifted.
				return true, nil
			}
			n, err := j.nodeNow(ctx)
			// A node this join already released (releaseStep) is not cordoned again.
			held := err == nil && (n == nil || n.Spec.Unschedulable || hasTaint(n, cluster.JoiningTaint) || n.Annotations[releasedAnnotation] == j.intent.VerifyID)
			if err == nil && !held {
				// Decided here, so that the runner records it before the cordon: a join killed
				// once the node is cordoned still uncordons it.
				j.intent.Cordoned = true
			}
			return held, err
		},
		Apply: func(ctx context.Context) error { return cordon(ctx, j.cl, j.intent.Node, true) },
	}
}

// peerFirewallSteps open the peer ports to the new worker on every node whose firewall kip
// manages: the server and the existing workers.
func (j *joiner) peerFirewallSteps() []workflow.Step {
	var steps []workflow.Step
	if j.fwServer {
		fam, _ := host.Identify(j.serverFacts.OS)
		steps = append(steps, fam.FirewallStep("server-firewall", "the server", j.server, j.serverRules()))
	}
	for _, name := range sortedPeers(j.peers) {
		if p := j.peers[name]; p.worker.FirewallManaged {
			steps = append(steps, p.family.FirewallStep("peer-firewall-"+name, name, p.c, j.peerRules(p)))
		}
	}
	return steps
}

// agentFiles are the worker's k3s configuration and join token.
func (j *joiner) agentFiles() ([]hostFile, error) {
	cfg := k3s.AgentConfig{Server: j.intent.Path.Server.String(), NodeName: j.intent.Node, NodeIP: j.intent.Path.Node.String(),
		Taints: []string{cluster.JoiningTaint + "=true:" + string(corev1.TaintEffectNoSchedule)}}
	if pub, err := j.nodeFacts.NodeIP(j.node.Host()); err == nil && pub != cfg.NodeIP {
		cfg.NodeExternalIP = pub
	}
	body, err := cfg.Render()
	if err != nil {
		return nil, err
	}
	return []hostFile{{k3s.ConfigPath, body}, {k3s.AgentTokenPath, j.token}}, nil
}

// filesInPlace reports whether each file is on the node as kip would write it.
func (j *joiner) filesInPlace(ctx context.Context, files []hostFile) (bool, error) {
	var paths []string
	for _, f := range files {
		paths = append(paths, f.path)
	}
	have, err := j.node.FileSums(ctx, paths...)
	if err != nil {
		return false, err
	}
	for _, f := range files {
		if have[f.path] != sshx.SHA256(f.data) {
			return false, nil
		}
	}
	return true, nil
}

func (j *joiner) k3sSteps() []workflow.Step {
	files, filesErr := j.agentFiles()
	unitName, unitFile, unitErr := k3s.Unit("agent")
	unit := []hostFile{{k3s.UnitPath(unitName), unitFile}}
	return []workflow.Step{
		{
			Name: "k3s-binary", Title: "Install k3s " + j.version,
			Done: "Installed k3s " + j.version, Already: "k3s " + j.version + " already installed",
			Check: func(ctx context.Context) (bool, error) {
				v, err := k3s.RemoteVersion(ctx, j.node, k3s.BinaryPath)
				if err != nil || v != j.version || j.binary.Bundle == nil {
					return err == nil && v == j.version, err
				}
				return j.filesInPlace(ctx, []hostFile{{k3s.BinaryPath, j.binary.Bundle.Data}})
			},
			Plan:  func(context.Context) ([]string, error) { return []string{j.binary.Plan(j.o.AirgapBundle)}, nil },
			Apply: func(ctx context.Context) error { return j.binary.Install(ctx) },
		},
		{
			Name: "k3s-config", Title: "Write k3s's agent configuration and join token",
			Done: "Wrote k3s's agent configuration (the previous file kept as " + k3s.ConfigBackupPath + ")", Already: "k3s's agent configuration already as kip writes it",
			Check: func(ctx context.Context) (bool, error) {
				if filesErr != nil {
					return false, filesErr
				}
				ok, err := j.filesInPlace(ctx, files)
				if err == nil && !ok {
					// Decided here, so that the runner records it before the files change: a
					// join killed once they changed still restarts k3s-agent on them, and one
					// killed after that restart finds it done (another systemd invocation).
					j.intent.Restart = true
					j.intent.AgentRun, err = j.agentRun(ctx)
				}
				return ok, err
			},
			Plan: func(context.Context) ([]string, error) {
				return []string{"write " + k3s.ConfigPath, "write " + k3s.AgentTokenPath + " (0600)"}, filesErr
			},
			Apply: func(ctx context.Context) error {
				dirs := []string{"-p", "-m", "0700", path.Dir(k3s.ConfigPath)}
				if _, err := j.node.Output(ctx, sshx.Command("mkdir", dirs...)+" && "+k3s.BackupCommand(k3s.ConfigPath)); err != nil {
					return fmt.Errorf("back up k3s's configuration: %w", err)
				}
				for _, f := range files {
					if err := j.node.Upload(ctx, f.path, f.data, 0o600, ""); err != nil {
						return err
					}
				}
				return nil
			},
		},
		{
			Name: "k3s-unit", Title: "Install the k3s-agent service",
			Done: "Installed the k3s-agent service", Already: "k3s-agent service already installed",
			Check: func(ctx context.Context) (bool, error) {
				if unitErr != nil {
					return false, unitErr
				}
				ok, err := j.filesInPlace(ctx, unit)
				if !ok || err != nil {
					return false, err
				}
				res, err := j.node.Probe(ctx, sshx.Command("systemctl", "is-enabled", "--quiet", unitName))
				return err == nil && res.ExitStatus == 0, err
			},
			Apply: func(ctx context.Context) error {
				if err := j.node.Upload(ctx, unit[0].path, unitFile, 0o644, ""); err != nil {
					return err
				}
				if _, err := j.node.Output(ctx, "systemctl daemon-reload && "+sshx.Command("systemctl", "enable", unitName)); err != nil {
					return fmt.Errorf("enable %s: %w", unitName, err)
				}
				return nil
			},
		},
		{
			Name: "k3s-start", Title: "Start k3s-agent and wait for node " + j.intent.Node + " to be Ready",
			Done: "Node " + j.intent.Node + " is Ready", Already: "Node " + j.intent.Node + " already Ready on kip's configuration",
			Check: func(ctx context.Context) (bool, error) {
				if j.intent.Restart {
					run, err := j.agentRun(ctx)
					if err != nil || run == "" || run == j.intent.AgentRun {
						return false, err
					}
				}
				ready, _, err := j.nodeReady(ctx)
				return ready, err
			},
			Apply: func(ctx context.Context) error {
				if _, err := j.node.Output(ctx, sshx.Command("systemctl", "restart", unitName)); err != nil {
					return fmt.Errorf("start %s: %w (see 'journalctl -u %s' on %s)", unitName, err, unitName, j.o.Host)
				}
				err := kube.Poll(ctx, joinTimeout, "node "+j.intent.Node+" Ready", func(ctx context.Context) (bool, string, error) {
					return j.nodeReady(ctx)
				})
				if err != nil {
					return fmt.Errorf("%w (see 'journalctl -u %s' on %s)", err, unitName, j.o.Host)
				}
				return nil
			},
		},
	}
}

// agentRun is systemd's InvocationID of k3s-agent's current run on the node, "" when it does not
// run: the host's own ID, so that no clock is compared with another machine's.
func (j *joiner) agentRun(ctx context.Context) (string, error) {
	out, err := j.node.Query(ctx, sshx.Command("systemctl", "show", k3s.AgentUnit, "-p", "InvocationID", "--value"))
	if err != nil {
		return "", fmt.Errorf("systemctl show %s: %w", k3s.AgentUnit, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// nodeReady reports whether the node registered at its address on the nodes' network and is
// Ready, and how it stands otherwise.
func (j *joiner) nodeReady(ctx context.Context) (bool, string, error) {
	n, err := j.nodeNow(ctx)
	if err != nil || n == nil {
		return false, "not registered", err
	}
	if !slices.Contains(internalIPs(n), j.intent.Path.Node.String()) {
		return false, "registered with addresses " + strings.Join(internalIPs(n), ", "), nil
	}
	status := cluster.NodeStatus(n)
	return status == cluster.NodeReady, status, nil
}

// verifyStep checks from the node: cluster DNS, the server's API through its Service, the
// cluster registry through the node port the node's containerd pulls from, and the kubelet,
// through which the server reads the check pod's log.
func (j *joiner) verifyStep() workflow.Step {
	nodes := []string{j.intent.Node}
	return workflow.Step{
		Name: "verify", Title: "Check DNS, the server's API, the cluster registry and the kubelet from " + j.intent.Node,
		Done: "DNS, the server's API, the cluster registry and the kubelet work from " + j.intent.Node, Already: j.intent.Node + " already checked",
		Check: func(ctx context.Context) (bool, error) {
			return verify.Passed(ctx, j.cl.Kube, j.intent.VerifyID, nodes)
		},
		Apply: func(ctx context.Context) error {
			if err := verify.Run(ctx, j.cl.Kube, j.intent.VerifyID, nodes, checkTimeout, verify.WithRegistry(components.RegistryNodePort)); err != nil {
				return err
			}
			_, err := verify.Log(ctx, j.cl.Kube, j.intent.VerifyID, j.intent.Node)
			if err != nil {
				return fmt.Errorf("%w: the server cannot reach the kubelet of %s on %d/tcp at %s", err, j.intent.Node, host.KubeletPort, j.intent.Path.Node)
			}
			return nil
		},
	}
}

// longhornStep waits until Longhorn's manager reports the node ready.
func (j *joiner) longhornStep() workflow.Step {
	return workflow.Step{
		Name: "longhorn", Title: "Check Longhorn's storage on " + j.intent.Node,
		Done: "Longhorn's storage is ready on " + j.intent.Node, Already: "Longhorn's storage already ready on " + j.intent.Node,
		Check: func(ctx context.Context) (bool, error) {
			ok, _, err := j.longhornReady(ctx)
			if err != nil || !ok {
				return false, err
			}
			copies, err := j.recordedCopies(ctx)
			if err != nil {
				return false, err
			}
			return copiesPlaced(ctx, j.cl, j.intent.Node, copies)
		},
		Apply: func(ctx context.Context) error {
			err := kube.Poll(ctx, checkTimeout, "Longhorn's node "+j.intent.Node+" ready", j.longhornReady)
			if err != nil {
				return fmt.Errorf("%w: see Longhorn's pods there ('kubectl -n %s get pods -o wide --field-selector spec.nodeName=%s')", err, longhorn.Namespace, j.intent.Node)
			}
			copies, err := j.recordedCopies(ctx)
			if err != nil {
				return err
			}
			return placeCopies(ctx, j.cl, j.intent.Node, cluster.MayHoldCopies(copies))
		},
	}
}

// recordedCopies is whether the worker may hold copies as its record says: until its disk check
// passes (a first join, or one with --no-copies), Longhorn places no new copy there.
func (j *joiner) recordedCopies(ctx context.Context) (string, error) {
	n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
	return n.Workers[j.intent.Node].Copies, err
}

func (j *joiner) longhornReady(ctx context.Context) (bool, string, error) {
	n, err := j.cl.Longhorn.LonghornV1beta2().Nodes(longhorn.Namespace).Get(ctx, j.intent.Node, metav1.GetOptions{})
	if err != nil {
		return false, "no Longhorn node yet", nil //nolint:nilerr // Longhorn's manager creates it when it starts there
	}
	// Ready, not Schedulable: Longhorn stops scheduling onto a cordoned node, as a rejoin's is.
	for _, c := range n.Status.Conditions {
		if c.Type == longhornv1beta2.NodeConditionTypeReady {
			return c.Status == longhornv1beta2.ConditionStatusTrue, "Longhorn's node is not ready: " + c.Message, nil
		}
	}
	return false, "Longhorn's node reports no readiness yet", nil
}

// releasedAnnotation on a node names the join (its VerifyID) that last let ordinary workloads
// onto it, written with that release: a join run again after its release does not cordon the
// node again for checks that passed.
const releasedAnnotation = "kipper.run/released-by-join"

// releaseStep lets ordinary workloads onto the node: the joining taint lifted, and the cordon
// of a rejoin; the node marked released by this join.
func (j *joiner) releaseStep() workflow.Step {
	return workflow.Step{
		Name: "release", Title: "Let ordinary workloads onto " + j.intent.Node,
		Done: "Ordinary workloads can run on " + j.intent.Node, Already: "Ordinary workloads already run on " + j.intent.Node,
		Check: func(ctx context.Context) (bool, error) {
			n, err := j.nodeNow(ctx)
			return err == nil && n != nil && !hasTaint(n, cluster.JoiningTaint) && !(j.intent.Cordoned && n.Spec.Unschedulable), err
		},
		Apply: func(ctx context.Context) error {
			err := updateNode(ctx, j.cl, j.intent.Node, func(n *corev1.Node) bool {
				changed := hasTaint(n, cluster.JoiningTaint) || j.intent.Cordoned && n.Spec.Unschedulable
				n.Spec.Taints = withoutTaint(n.Spec.Taints, cluster.JoiningTaint)
				if j.intent.Cordoned {
					n.Spec.Unschedulable = false
				}
				if changed {
					metav1.SetMetaDataAnnotation(&n.ObjectMeta, releasedAnnotation, j.intent.VerifyID)
				}
				return changed
			})
			if err != nil {
				return fmt.Errorf("lift the joining taint from %s: %w", j.intent.Node, err)
			}
			return nil
		},
	}
}

func (j *joiner) readyStep() workflow.Step {
	why := "the disk check has not run"
	if j.o.NoCopies {
		why = "joined with --no-copies"
	}
	return workflow.Step{
		Name: "recorded", Title: "Record worker " + j.intent.Node + " as ready",
		Done: "Recorded worker " + j.intent.Node + " as ready", Already: "Worker " + j.intent.Node + " already recorded as ready",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
			return n.Workers[j.intent.Node].State == cluster.WorkerReady, err
		},
		Apply: func(ctx context.Context) error {
			return cluster.UpdateWorker(ctx, j.cl.Dynamic, j.intent.Node, func(w *cluster.Worker) {
				w.State = cluster.WorkerReady
				if w.JoinedAt.IsZero() {
					w.JoinedAt = time.Now().UTC()
				}
				if w.Copies == cluster.CopiesUnchecked {
					w.CopiesWhy = why
				}
			})
		},
	}
}

// copiesStep runs the disk-sync check at the end of each join (a join resumed after it finds it
// done) and records whether the worker may hold copies of volumes; a disk that fails it does not
// fail the join.
func (j *joiner) copiesStep() workflow.Step {
	name := j.intent.Node
	return workflow.Step{
		Name: "copies", Title: "Check whether " + name + "'s disk may hold copies of volumes (how long it takes to sync small writes)",
		Done: "Checked " + name + "'s disk", Already: name + "'s disk already checked by this join",
		Check: func(ctx context.Context) (bool, error) {
			n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
			if err != nil || n.Workers[name].CopiesJoin != j.intent.VerifyID {
				return false, err
			}
			return copiesPlaced(ctx, j.cl, name, n.Workers[name].Copies)
		},
		Apply: func(ctx context.Context) error {
			n, err := cluster.ReadNodes(ctx, j.cl.Dynamic)
			if err != nil {
				return err
			}
			if w := n.Workers[name]; w.CopiesJoin == j.intent.VerifyID { // checked, and killed before Longhorn heard
				return placeCopies(ctx, j.cl, name, cluster.MayHoldCopies(w.Copies))
			}
			copies, why, err := checkCopies(ctx, j.cl, j.node, name, false, j.intent.VerifyID)
			if err != nil {
				return err
			}
			if err := reportCopies(j.p, name, copies, why); err != nil {
				j.p.Warn(err.Error())
			}
			return nil
		},
	}
}

// summary ends the join: what joined how, the firewall rules the operator must add, and the
// provider's firewall rules.
func (j *joiner) summary(ctx context.Context) {
	j.p.Success(fmt.Sprintf("Worker %s joined over %s, k3s %s", j.intent.Node, j.intent.Path, j.version))
	if !j.intent.Firewall {
		j.p.Info(fmt.Sprintf("%s's firewall is yours: allow %s only, keep 8888/tcp closed to outside traffic, and limit access to any NodePort services",
			j.intent.Node, host.Describe(j.nodeRules())))
	}
	if !j.fwServer {
		j.p.Info("The server's firewall is yours: allow " + host.Describe(host.PeerRules(append(j.nodes.WorkerAddresses(j.intent.Node), j.intent.Path.Node), netip.Addr{})) + " on it")
	}
	for _, name := range sortedPeers(j.peers) {
		if p := j.peers[name]; !p.worker.FirewallManaged {
			j.p.Info(fmt.Sprintf("Worker %s's firewall is yours: allow %s on it", name, host.Describe(host.PeerRules([]netip.Addr{j.intent.Path.Node}, netip.Addr{}))))
		}
	}
	j.p.Info("Your provider's firewall or security group must allow the same traffic, in both directions between the nodes even when a join passes without it:")
	j.p.Info(fmt.Sprintf("  %d/udp and %d/tcp between every two nodes", host.WireGuardPort, host.KubeletPort))
	j.p.Info(fmt.Sprintf("  %d/tcp from the server (%s) to each worker", host.NodeMetricsPort, j.intent.Path.Server))
	j.p.Info(fmt.Sprintf("  6443/tcp from each worker to the server (%s)", j.intent.Path.Server))
	if j.intent.Path.Mode == cluster.ModePrivate {
		j.p.Info(fmt.Sprintf("  %d/tcp (SSH) from the server to %s", sshPort(j.node), j.intent.Path.Node))
	}
	if replicas, err := workerReplicas(ctx, j.cl, j.serverAtStart.Name); err != nil {
		j.p.Warn("cannot list the volume copies on workers: " + err.Error())
	} else {
		for _, c := range replicas {
			j.p.Warn(c.Sentence())
		}
	}
	j.o.Debugf("%d remote commands on every host, %s in all", j.commands(), time.Since(j.started).Round(time.Second))
}

// workerReplicas lists the Longhorn volumes with no current replica on the server
// (longhorn.WorkerReplicas).
func workerReplicas(ctx context.Context, cl *kube.Clients, server string) ([]longhorn.WorkerReplica, error) {
	lh := cl.Longhorn.LonghornV1beta2()
	vols, err := lh.Volumes(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's volumes: %w", err)
	}
	replicas, err := lh.Replicas(longhorn.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Longhorn's replicas: %w", err)
	}
	return longhorn.WorkerReplicas(vols.Items, replicas.Items, func(n string) bool { return n == server }), nil
}
