package e2e_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"

	"kipper.run/kip/internal/fault"
	"kipper.run/kip/internal/k3s"
	"kipper.run/kip/internal/kube"
	"kipper.run/kip/test/controlplane"
	"kipper.run/kip/test/e2e"
	"kipper.run/kip/test/lab"
)

// apiServerRepair is spec 002's "Clusters installed before operator login existed" on a lab
// cluster (the k3s stand-in hands kube-apiserver-arg to the real kube-apiserver, which writes
// the audit log it names):
//   - the server's config.yaml loses its kube-apiserver-arg block and the files it names, and
//     k3s runs on that, as on a cluster an earlier kip installed; Dex does not run in the lab;
//   - kip upgrade --skip-system, killed right after each write it makes and resumed each time,
//     adds the audit arguments (not the login: Dex does not answer, which it says), writes the
//     audit policy and restarts k3s once: the file is the operator's with the block appended,
//     the real API server writes the audit log, no restart is left pending;
//   - with a stand-in Dex answering its discovery document behind the chart's Service, the next
//     upgrade adds authentication-config and the file install writes for it; before it the
//     server's admin certificate is rotated and kip's saved kubeconfig trusts another CA, so
//     the upgrade reaches the API only once it has saved the server's CA and certificate;
//   - a new audit policy on which k3s does not come back: nothing restored, the error naming
//     the file, the change left pending;
//   - an operator's own block lacking the arguments: the additions printed, nothing changed;
//   - config.yaml losing the arguments while that change is pending: the next run adds its
//     backup to the pending change and is killed right after writing it; k3s refusing the
//     changed config.yaml, the run after restores both previous files and k3s comes back;
//     refusing every start: the rollback's restart failing too, told apart (the test ends
//     there, with systemd starting k3s again on the restored file).
func apiServerRepair(ctx context.Context, t *testing.T, s *e2e.Suite, home string, h *lab.Host, c *kube.Clients) {
	t.Helper()
	run := hostRunner(ctx, t, h)
	read := func(path string) string {
		t.Helper()
		return run("if [ -f " + path + " ]; then cat " + path + "; else echo absent; fi")
	}
	inject := func(name string) {
		t.Helper()
		run("mkdir -p /etc/k3s-standin && echo " + name + " > /etc/k3s-standin/fault")
	}
	restart := func() {
		t.Helper()
		run("systemctl restart k3s")
		if err := kube.WaitReady(ctx, c, h.PublicIP.String(), 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	want := k3s.ServerConfig{AuthenticationConfigPath: k3s.AuthenticationConfigPath}.APIServerArgs()
	audit, login := want[:len(want)-1], want[len(want)-1]
	authn := read(k3s.AuthenticationConfigPath)
	installed := read(k3s.ConfigPath)
	old := withoutAPIServerArgs(t, installed)
	upgradeArgs := []string{"upgrade", "--skip-system", "--yes", "-v"}

	// A server as an earlier kip left it: no arguments, no files, no audit log.
	run("printf '%s' " + shellQuote(old) + " > " + k3s.ConfigPath + " && rm -f " + k3s.AuditPolicyPath + " " + k3s.AuthenticationConfigPath + " " + k3s.AuditLogPath)
	restart()

	outage := watchAPI(ctx, c)
	var said strings.Builder
	r, writes := s.KillEveryWrite(t, home, nil, func(_ string, r e2e.Result) { said.WriteString(r.Stderr) }, upgradeArgs...)
	if r.ExitCode != 0 {
		t.Fatalf("kip upgrade after the kills: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	t.Logf("the API's longest outage during the repair: %s", outage())
	var onHost []string
	for _, w := range writes {
		if strings.HasPrefix(w, "ssh ") {
			onHost = append(onHost, w)
		}
	}
	if len(onHost) < 5 { // the backups and marker, the policy, config.yaml, the restart, the marker cleared
		t.Errorf("the repair was killed after %d writes on the server, want at least 5: %q", len(onHost), writes)
	}
	// (Each run that finished the step was killed right after: the step's done line is the next
	// repair's to say.)
	for _, w := range []string{"The API server is missing the arguments this kip installs. Adding them and restarting k3s once; workloads keep running through it.",
		"Operator login could not be configured: Dex does not answer"} {
		if !strings.Contains(r.Stderr, w) && !strings.Contains(said.String(), w) {
			t.Errorf("no run of the repair said %q:\n%s", w, r.Stderr)
		}
	}
	wantConfig, err := k3s.AddAPIServerArgs([]byte(old), audit)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(k3s.ConfigPath); got != string(wantConfig) {
		t.Errorf("config.yaml after the repair:\n%s\nwant\n%s", got, wantConfig)
	}
	if got := read(k3s.AuditPolicyPath); got != string(k3s.AuditPolicy()) {
		t.Errorf("the audit policy after the repair:\n%s", got)
	}
	if got := read(k3s.AuthenticationConfigPath); got != "absent\n" {
		t.Errorf("the authentication configuration was written although Dex does not answer:\n%s", got)
	}
	if got := read(k3s.PendingPath); got != "absent\n" {
		t.Errorf("a restart is still pending after the repair: %s", got)
	}
	if got := run("grep -c audit.k8s.io/v1 " + k3s.AuditLogPath + " || true"); strings.TrimSpace(got) == "0" {
		t.Errorf("the API server writes no audit log after the repair")
	}

	// Dex answers (a stand-in serving its discovery document behind the chart's Service): the
	// next upgrade adds the login. Before it, the cluster CA and the admin certificate kip keeps
	// both go stale: the server's admin certificate is rotated as 'k3s certificate rotate
	// --service admin' does (its files removed, k3s restarted: k3s issues a new one and rewrites
	// k3s.yaml), and the saved kubeconfig trusts another CA, as after a rotation of the cluster
	// CA. The upgrade reaches the API only through the server's, which it saves first.
	dexStandin(ctx, t, c, h, k3s.DexIssuer(h.PublicIP.String()))
	savedPath := staleKubeconfig(t, home, h)
	run("rm -f " + tlsDir + "/client-admin.crt " + tlsDir + "/client-admin.key")
	restart()
	r = s.Kip(t, home, upgradeArgs...)
	if r.ExitCode != 0 || !strings.Contains(r.Stderr, "API server arguments, and k3s restarted on them") || !strings.Contains(r.Stderr, "Operator login configured") {
		t.Fatalf("kip upgrade with Dex answering: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if w := "brought up to date with the server's: the cluster CA and the admin certificate changed"; !strings.Contains(r.Stderr, w) {
		t.Errorf("the upgrade did not say %q:\n%s", w, r.Stderr)
	}
	savedCA, savedCert := kubeconfigCerts(t, savedPath)
	if want := read(tlsDir + "/server-ca.crt"); savedCA != want {
		t.Errorf("the saved kubeconfig trusts\n%s\nnot the server's CA\n%s", savedCA, want)
	}
	if want := read(tlsDir + "/client-admin.crt"); savedCert != want {
		t.Errorf("the saved kubeconfig presents\n%s\nnot the server's admin certificate\n%s", savedCert, want)
	}
	if fi, err := os.Stat(savedPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the saved kubeconfig: %v, %v", fi, err)
	}
	if wantConfig, err = k3s.AddAPIServerArgs(wantConfig, []string{login}); err != nil {
		t.Fatal(err)
	}
	if got := read(k3s.ConfigPath); got != string(wantConfig) {
		t.Errorf("config.yaml after the login was added:\n%s\nwant\n%s", got, wantConfig)
	}
	if got := read(k3s.AuthenticationConfigPath); got != authn {
		t.Errorf("the authentication configuration is not the one install writes:\n%s\nwant\n%s", got, authn)
	}

	repaired := read(k3s.ConfigPath)

	// A new audit policy (config.yaml as it is) on which k3s does not come back: nothing restored.
	run("echo '# an older policy' >> " + k3s.AuditPolicyPath)
	olderPolicy := read(k3s.AuditPolicyPath)
	inject("refuse-every-start")
	r = s.Kip(t, home, upgradeArgs...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip restored nothing") || !strings.Contains(r.Stderr, k3s.ConfigBackupPath) {
		t.Fatalf("a restart that changed no config.yaml: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := read(k3s.ConfigPath); got != repaired {
		t.Errorf("config.yaml changed by a failed restart that changed no configuration:\n%s", got)
	}
	if got := read(k3s.PendingPath); got != k3s.AuditPolicyPath+"\n" {
		t.Errorf("the pending change after the failed restart names %q, want the audit policy alone", got)
	}
	run("rm /etc/k3s-standin/fault")
	if err := kube.WaitReady(ctx, c, h.PublicIP.String(), 2*time.Minute); err != nil { // systemd starts it again
		t.Fatal(err)
	}

	// An operator's own block that lacks kip's arguments: the additions, and nothing changed.
	custom := old + "kube-apiserver-arg:\n  - v=2\n"
	run("printf '%s' " + shellQuote(custom) + " > " + k3s.ConfigPath)
	r = s.Kip(t, home, upgradeArgs...)
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "not the one kip writes") || !strings.Contains(r.Stderr, "      - "+login) {
		t.Errorf("kip upgrade on an operator's own block: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := read(k3s.ConfigPath); got != custom {
		t.Errorf("config.yaml changed although the block is the operator's:\n%s", got)
	}

	// The change still pending (the audit policy's), config.yaml loses the arguments: the next run
	// backs it up too and adds it to the pending change, and is killed right after writing it;
	// k3s then refuses the changed config.yaml, and the run after restores both previous files
	// (the pending marker names them).
	run("printf '%s' " + shellQuote(old) + " > " + k3s.ConfigPath)
	restart()
	killAtConfig := fault.KillWriteMatchingEnv + "=" + regexp.QuoteMeta("cat >"+k3s.ConfigPath+".kip-tmp-")
	if r = s.KipEnv(t, home, []string{killAtConfig}, upgradeArgs...); r.Signal != syscall.SIGKILL {
		t.Fatalf("kip upgrade was to be killed right after writing config.yaml: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := read(k3s.PendingPath); got != k3s.AuditPolicyPath+"\n"+k3s.ConfigPath+"\n" {
		t.Errorf("the pending change names %q, want the audit policy and config.yaml", got)
	}
	inject("refuse-changed-config")
	r = s.Kip(t, home, upgradeArgs...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "kip restored the previous configuration and k3s runs on it again") {
		t.Fatalf("restart refused, rollback works: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := read(k3s.ConfigPath); got != old {
		t.Errorf("config.yaml after the rollback:\n%s\nwant\n%s", got, old)
	}
	if got := read(k3s.AuditPolicyPath); got != olderPolicy {
		t.Errorf("the audit policy after the rollback:\n%s\nwant the one before the pending change\n%s", got, olderPolicy)
	}
	if got := read(k3s.PendingPath); got != "absent\n" {
		t.Errorf("a restart is pending after the rollback: %s", got)
	}

	// k3s refuses every start: the rollback's restart fails too.
	inject("refuse-every-start")
	r = s.Kip(t, home, upgradeArgs...)
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "and not on the restored previous one either") {
		t.Fatalf("every start refused: exit %d\n%s", r.ExitCode, r.Stderr)
	}
	if got := read(k3s.ConfigPath); got != old {
		t.Errorf("config.yaml after the failed rollback:\n%s\nwant\n%s", got, old)
	}
	run("rm /etc/k3s-standin/fault")
}

// withoutAPIServerArgs is config without its kube-apiserver-arg block.
// tlsDir is where k3s keeps the server's certificates.
const tlsDir = "/var/lib/rancher/k3s/server/tls"

// staleKubeconfig makes the kubeconfig kip saved for the lab server trust another CA, and
// returns its path.
func staleKubeconfig(t *testing.T, home string, h *lab.Host) string {
	t.Helper()
	path := filepath.Join(home, "kubeconfigs", h.PublicIP.String()+".yaml")
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other, err := controlplane.Issue(nil, controlplane.Template{Subject: pkix.Name{CommonName: "k3s-server-ca"}, IsCA: true, KeyUsage: x509.KeyUsageCertSign, NotAfter: time.Now().Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		cl.CertificateAuthorityData = other.CertPEM
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeconfigCerts are the CA a kubeconfig trusts and the certificate it presents.
func kubeconfigCerts(t *testing.T, path string) (ca, cert string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kc := cfg.Contexts[cfg.CurrentContext]
	if kc == nil || cfg.Clusters[kc.Cluster] == nil || cfg.AuthInfos[kc.AuthInfo] == nil {
		t.Fatalf("%s has no current context with its cluster and user", path)
	}
	return string(cfg.Clusters[kc.Cluster].CertificateAuthorityData), string(cfg.AuthInfos[kc.AuthInfo].ClientCertificateData)
}

func withoutAPIServerArgs(t *testing.T, config string) string {
	t.Helper()
	var out []string
	in := false
	for _, line := range strings.SplitAfter(config, "\n") {
		switch {
		case strings.HasPrefix(line, "kube-apiserver-arg:"):
			in = true
		case in && strings.HasPrefix(line, "- "), in && strings.HasPrefix(line, "  - "):
		default:
			in = false
			out = append(out, line)
		}
	}
	if got := strings.Join(out, ""); got != config {
		return got
	}
	t.Fatalf("config.yaml has no kube-apiserver-arg block:\n%s", config)
	return ""
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// dexStandin runs a stand-in for the cluster's Dex on h: busybox's httpd serving the discovery
// document of issuer behind the Service and port of Dex's chart, which is all kip asks Dex.
func dexStandin(ctx context.Context, t *testing.T, c *kube.Clients, h *lab.Host, issuer string) {
	t.Helper()
	labels := map[string]string{"app": "dex-standin"}
	doc := `{"issuer":"` + issuer + `"}`
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dex-standin", Namespace: "dex", Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:    h.Name,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "dex", Image: busyboxImage, Command: []string{"sh", "-c",
				"mkdir -p /www/.well-known && echo '" + doc + "' > /www/.well-known/openid-configuration && exec httpd -f -p 5556 -h /www"}}},
		},
	}
	if _, err := c.Kube.CoreV1().Pods("dex").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dex", Namespace: "dex"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 5556, TargetPort: intstr.FromInt32(5556)}}},
	}
	if _, err := c.Kube.CoreV1().Services("dex").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, 5*time.Minute, "the Dex stand-in running", func(ctx context.Context) (bool, error) {
		got, err := c.Kube.CoreV1().Pods("dex").Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatal(err)
	}
}
