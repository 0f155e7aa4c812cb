package status

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	longhornv1beta2 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"

	"kipper.run/kip/internal/cluster"
	"kipper.run/kip/internal/host"
	"kipper.run/kip/internal/longhorn"
	"kipper.run/kip/internal/sshx"
	"kipper.run/kip/internal/workflow"
)

// certPEM returns a self-signed certificate valid until notAfter, PEM-encoded.
func certPEM(t testing.TB, cn string, notAfter time.Time, ca bool) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             notAfter.Add(-365 * 24 * time.Hour),
		NotAfter:              notAfter,
		IsCA:                  ca,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func certFileOf(t testing.TB, path string, notAfter ...time.Time) certFile {
	t.Helper()
	var data []byte
	for _, na := range notAfter {
		data = append(data, certPEM(t, filepath.Base(path), na, false)...)
	}
	certs, err := parseCerts(data)
	return certFile{path: path, certs: certs, err: err}
}

func TestCheckCerts(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const tls = "/tls"
	server := target{node: "srv", addr: "203.0.113.10", server: true}
	worker := target{node: "w1", addr: "203.0.113.11"}
	day := 24 * time.Hour
	srvOK := certFileOf(t, tls+"/serving-kube-apiserver.crt", now.Add(300*day))
	agentOK := certFileOf(t, "/agent/client-kubelet.crt", now.Add(200*day))
	tests := []struct {
		name    string
		t       target
		files   []certFile
		want    CheckStatus
		detail  string
		fixPart string
	}{
		{"all valid", server, []certFile{srvOK, agentOK}, StatusOK, "the first to expire is /agent/client-kubelet.crt on 2027-06-19 (in 200 days)", ""},
		{"expires in 30 days exactly", worker, []certFile{certFileOf(t, "/agent/a.crt", now.Add(30*day))}, StatusOK, "in 30 days", ""},
		{"expires in 29 days", worker, []certFile{certFileOf(t, "/agent/a.crt", now.Add(29*day))}, StatusWarn, "expiring within 30 days: /agent/a.crt", "kip node reboot w1"},
		{"server cert expires in a day", server, []certFile{certFileOf(t, tls+"/client-admin.crt", now.Add(day)), agentOK}, StatusWarn, "/tls/client-admin.crt", "systemctl restart k3s"},
		{"expires now", worker, []certFile{certFileOf(t, "/agent/a.crt", now)}, StatusFail, "expired: /agent/a.crt", "kip node add 203.0.113.11"},
		{"expired a second ago", worker, []certFile{certFileOf(t, "/agent/a.crt", now.Add(-time.Second))}, StatusFail, "expired", "rejoins the worker"},
		{"server cert expired", server, []certFile{certFileOf(t, tls+"/client-admin.crt", now.Add(-day)), agentOK}, StatusFail, "expired: /tls/client-admin.crt", "k3s certificate rotate"},
		{"server's agent cert expired", server, []certFile{srvOK, certFileOf(t, "/agent/client-kubelet.crt", now.Add(-day))}, StatusFail, "expired", "issues its own agent certificates"},
		{"chain: the leaf expires first", worker, []certFile{certFileOf(t, "/agent/chain.crt", now.Add(3650*day), now.Add(10*day))}, StatusWarn, "expiring within 30 days: /agent/chain.crt", ""},
		{"no server certs on a server", server, []certFile{agentOK}, StatusFail, "no server certificates in /tls", "systemctl status k3s"},
		{"no agent certs on a worker", worker, nil, StatusFail, "no agent certificates on w1", "kip node add 203.0.113.11"},
		{"an unreadable file", worker, []certFile{agentOK, {path: "/agent/bad.crt", err: errNoPEM(t)}}, StatusWarn, "unreadable: /agent/bad.crt", "k3s rewrites them"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := checkCerts(tt.t, tls, tt.files, now)
			if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || !strings.Contains(c.Fix, tt.fixPart) {
				t.Fatalf("got %s %q fix %q; want %s with %q and fix with %q", c.Status, c.Detail, c.Fix, tt.want, tt.detail, tt.fixPart)
			}
			if c.Status != StatusOK && c.Fix == "" {
				t.Fatal("a warning or failure without a fix")
			}
		})
	}
	// A CA certificate close to expiry needs more than a restart.
	ca, _ := parseCerts(certPEM(t, "k3s-server-ca", now.Add(day), true))
	c := checkCerts(server, tls, []certFile{{path: tls + "/server-ca.crt", certs: ca}, agentOK}, now)
	if c.Status != StatusWarn || !strings.Contains(c.Fix, "rotate-ca") {
		t.Fatalf("CA expiring: %s %q", c.Status, c.Fix)
	}
}

func errNoPEM(t testing.TB) error {
	_, err := parseCerts([]byte("not a certificate"))
	if err == nil {
		t.Fatal("garbage parsed as a certificate")
	}
	return err
}

func TestCheckClock(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		skew, uncertainty time.Duration
		want              CheckStatus
	}{
		{0, 10 * ms, StatusOK},
		{4900 * ms, 0, StatusOK},
		{5 * time.Second, 0, StatusOK},
		{5100 * ms, 0, StatusWarn},
		{-5100 * ms, 0, StatusWarn},
		{5500 * ms, time.Second, StatusOK}, // the measurement explains it
		{30 * time.Second, 0, StatusWarn},
		{30100 * ms, 0, StatusFail},
		{-45 * time.Second, 500 * ms, StatusFail},
		{31 * time.Second, 2 * time.Second, StatusWarn},
	}
	for _, tt := range tests {
		c := checkClock("srv", "srv's", tt.skew, tt.uncertainty)
		if c.Status != tt.want {
			t.Errorf("skew %s ±%s: %s (%s), want %s", tt.skew, tt.uncertainty, c.Status, c.Detail, tt.want)
		}
		if c.Status != StatusOK && !strings.Contains(c.Fix, "timedatectl set-ntp true") {
			t.Errorf("skew %s: fix %q", tt.skew, c.Fix)
		}
	}
	if c := checkClock("", "the API server's", -7*time.Second, 0); !strings.Contains(c.Detail, "7s behind") {
		t.Errorf("detail %q", c.Detail)
	}
	// The skew as a number in -o json, and durations rounded in the text.
	c := checkClock("srv", "srv's", -(4*time.Minute + 59993877063*time.Nanosecond - 4*time.Minute), 1234567*time.Microsecond)
	if c.ClockSkewSeconds == nil || *c.ClockSkewSeconds != -59.994 || c.ClockUncertaintySeconds == nil || *c.ClockUncertaintySeconds != 1.235 {
		t.Errorf("skew %v ± %v", c.ClockSkewSeconds, c.ClockUncertaintySeconds)
	}
	if !strings.Contains(c.Detail, "srv's clock is 1m behind this machine's (±1.2s)") {
		t.Errorf("detail %q", c.Detail)
	}
	data, err := json.Marshal(checkClock("srv", "srv's", 4*time.Minute+59993877063*time.Nanosecond-4*time.Minute+4*time.Minute, 0))
	if err != nil || !strings.Contains(string(data), `"clockSkewSeconds":299.994`) || !strings.Contains(string(data), "clock is 5m ahead of") {
		t.Errorf("json %s", data)
	}
}

func TestDurationText(t *testing.T) {
	for d, want := range map[time.Duration]string{
		312456 * time.Microsecond:       "312ms",
		4237 * time.Millisecond:         "4.2s",
		59960 * time.Millisecond:        "1m",
		4*time.Minute + 59993877063:     "5m",
		4*time.Minute + 58400000000:     "4m58s",
		2*time.Hour + 5*time.Minute + 7: "2h5m",
		3 * time.Hour:                   "3h",
		-1500 * time.Millisecond:        "-1.5s",
	} {
		if got := durationText(d); got != want {
			t.Errorf("durationText(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestProbeClockSkew(t *testing.T) {
	sent := time.Unix(1000, 0)
	p := &probe{sent: sent, received: sent.Add(200 * time.Millisecond), clock: sent.Add(3100 * time.Millisecond), hasClock: true}
	skew, unc := p.clockSkew()
	if skew != 3*time.Second || unc != 100*time.Millisecond {
		t.Fatalf("skew %s ±%s", skew, unc)
	}
	p.clock = time.Unix(1003, 0) // whole seconds: a date without %N
	if _, unc := p.clockSkew(); unc != 1100*time.Millisecond {
		t.Fatalf("whole-second clock: ±%s", unc)
	}
	a := apiProbe{date: time.Unix(1010, 0), sent: sent, received: sent.Add(time.Second)}
	if skew, unc := a.skew(); skew != 10*time.Second || unc != time.Second {
		t.Fatalf("api skew %s ±%s", skew, unc)
	}
}

func TestKipVersion(t *testing.T) {
	tests := []struct {
		this, recorded string
		want           CheckStatus
		detail         string
	}{
		{"v0.3.0", "v0.3.0", StatusOK, "this kip installed"},
		{"v0.2.9", "v0.3.0", StatusWarn, "older"},
		{"v0.3.1", "v0.3.0", StatusWarn, "newer"},
		{"v1.0.0", "v0.9.9", StatusWarn, "newer"},
		{"v0.3.0-rc.1", "v0.3.0", StatusWarn, "older"},
		{"v0.3.0-4-gabc1234", "v0.3.0", StatusWarn, "newer"},
		{"v0.3.0-4-gabc1234-dirty", "v0.3.0-5-gdef5678", StatusWarn, "older"},
		{"v0.3.0-dirty", "v0.3.0", StatusOK, "this kip installed"},
		{"dev", "v0.3.0", StatusOK, "not comparable"},
		{"v0.3.0", "dev", StatusOK, "not comparable"},
		{"v0.3.0", "", StatusOK, "names no kip version"},
	}
	for _, tt := range tests {
		c := checkKipVersion(tt.this, tt.recorded)
		if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) {
			t.Errorf("%s vs %s: %s %q, want %s with %q", tt.this, tt.recorded, c.Status, c.Detail, tt.want, tt.detail)
		}
		// An older kip is upgraded; a newer one upgrades the cluster.
		fix := "upgrade kip to " + tt.recorded
		if tt.detail == "newer" {
			fix = "run 'kip upgrade --check' to see what the upgrade would fix, then 'kip upgrade'"
		}
		if c.Status == StatusWarn && !strings.Contains(c.Fix, fix) {
			t.Errorf("%s vs %s: fix %q, want %q", tt.this, tt.recorded, c.Fix, fix)
		}
	}
}

func node(name, version string, server bool, ready corev1.ConditionStatus, taints ...corev1.Taint) corev1.Node {
	n := corev1.Node{}
	n.Name = name
	n.Labels = map[string]string{}
	if server {
		n.Labels["node-role.kubernetes.io/control-plane"] = "true"
	}
	n.Spec.Taints = taints
	n.Status.NodeInfo.KubeletVersion = version
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletNotReady", Message: "PLEG is not healthy"}}
	}
	return n
}

func TestK3sVersions(t *testing.T) {
	pinned, err := pinnedK3s()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		versions []string
		want     CheckStatus
		detail   string
		fix      string
	}{
		{"on the pin", []string{pinned, pinned}, StatusOK, "every node runs " + pinned, ""},
		{"a server on an older revision", []string{strings.Replace(pinned, "+k3s1", "+k3s0", 1), pinned}, StatusWarn, "srv runs",
			"run 'kip install --host 203.0.113.10' again: it moves the server's k3s to " + pinned},
		{"a worker on an older revision", []string{pinned, strings.Replace(pinned, "+k3s1", "+k3s0", 1)}, StatusWarn, "w1 runs",
			"run 'kip install --host 203.0.113.10' again: after the server, it brings each ready worker to the server's k3s"},
		{"newer than the pin", []string{"v9.0.0+k3s1"}, StatusWarn, "newer than", "upgrade kip: use a kip release that pins v9.0.0+k3s1"},
		{"two minors behind", []string{"v1.35.1+k3s1"}, StatusWarn, "2 Kubernetes minors behind",
			"upgrade its k3s by hand one minor at a time, as the warning says, then run 'kip install --host 203.0.113.10' again"},
		{"no version", []string{""}, StatusWarn, "reports no k3s version", "kubectl describe node srv"},
		{"not a version", []string{"fake"}, StatusWarn, "is not a k3s release", "kubectl describe node srv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var nodes []corev1.Node
			for i, v := range tt.versions {
				nodes = append(nodes, node([]string{"srv", "w1"}[i], v, i == 0, corev1.ConditionTrue))
			}
			c := checkK3sVersions(nodes, "203.0.113.10")
			if c.Status != StatusOK && c.Fix == "" {
				t.Error("a warning without a fix")
			}
			if strings.Contains(c.Detail+c.Fix, "kip upgrade") {
				t.Errorf("names kip upgrade, which does not exist yet: %q fix %q", c.Detail, c.Fix)
			}
			if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || !strings.Contains(c.Fix, tt.fix) {
				t.Fatalf("%s %q fix %q", c.Status, c.Detail, c.Fix)
			}
		})
	}
}

func TestCheckNode(t *testing.T) {
	fence := corev1.Taint{Key: cluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	pressured := node("w2", "v", false, corev1.ConditionTrue)
	pressured.Status.Conditions = append(pressured.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue})
	cordoned := node("w3", "v", false, corev1.ConditionTrue)
	cordoned.Spec.Unschedulable = true
	tests := []struct {
		n      corev1.Node
		want   CheckStatus
		status string
		detail string
		fix    string
	}{
		{node("srv", "v", true, corev1.ConditionTrue), StatusOK, cluster.NodeReady, "Ready", ""},
		{node("srv", "v", true, corev1.ConditionFalse), StatusFail, cluster.NodeNotReady, "NotReady (KubeletNotReady: PLEG is not healthy)", "systemctl status k3s"},
		{node("w1", "v", false, corev1.ConditionUnknown), StatusFail, cluster.NodeUnknown, "Unknown", "kip node fence w1"},
		{node("w1", "v", false, ""), StatusFail, cluster.NodeUnknown, "has not reported Ready", "kip node add 198.51.100.7"},
		{node("w1", "v", false, corev1.ConditionTrue, fence), StatusWarn, cluster.NodeOutOfService, "fenced", "kip node remove w1 --force"},
		{pressured, StatusWarn, cluster.NodeReady, "DiskPressure", "free disk space"},
		{cordoned, StatusOK, cluster.NodeReady, "cordoned", ""},
	}
	for _, tt := range tests {
		if got := cluster.NodeStatus(&tt.n); got != tt.status {
			t.Errorf("%s: status %s, want %s", tt.n.Name, got, tt.status)
		}
		c := checkNode(&tt.n, "198.51.100.7")
		if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || !strings.Contains(c.Fix, tt.fix) {
			t.Errorf("%s: %s %q fix %q; want %s %q fix %q", tt.n.Name, c.Status, c.Detail, c.Fix, tt.want, tt.detail, tt.fix)
		}
	}
}

func TestDiskLevel(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		total, free uint64
		want        CheckStatus
	}{
		{100 * gib, 50 * gib, StatusOK},
		{100 * gib, 15 * gib, StatusOK},
		{100 * gib, 15*gib - 1, StatusWarn},
		{100 * gib, 10 * gib, StatusWarn},
		{100 * gib, 10*gib - 1, StatusFail},
		{20 * gib, 5 * gib, StatusOK}, // 25% and 5 GiB
		{20 * gib, 5*gib - 1, StatusWarn},
		{1000 * gib, 120 * gib, StatusWarn}, // plenty of GiB, but under 15%
		{0, 0, StatusOK},                    // df said nothing useful
	}
	for _, tt := range tests {
		if got := diskLevel(tt.total, tt.free); got != tt.want {
			t.Errorf("diskLevel(%d, %d) = %s, want %s", tt.total, tt.free, got, tt.want)
		}
	}
	c := checkHostDisk("srv", map[string]sshx.Disk{
		cluster.RancherDir:      {Mount: "/", TotalBytes: 100 * gib, FreeBytes: 9 * gib},
		cluster.LocalStorageDir: {Mount: "/", TotalBytes: 100 * gib, FreeBytes: 9 * gib},
	}, []string{cluster.RancherDir, cluster.LocalStorageDir})
	if c.Status != StatusFail || strings.Count(c.Detail, "free of") != 1 || !strings.Contains(c.Fix, "evicts pods") {
		t.Errorf("host disk: %s %q %q", c.Status, c.Detail, c.Fix)
	}
}

func TestLonghornRoom(t *testing.T) {
	const gib = 1 << 30
	s := longhorn.Settings{MinimalAvailable: 25, OverProvisioning: 100}
	ready := []longhornv1beta2.Condition{{Type: longhornv1beta2.DiskConditionTypeReady, Status: longhornv1beta2.ConditionStatusTrue}}
	tests := []struct {
		name                        string
		max, reserved, avail, sched int64
		allow, nodeAllow, evict     bool
		conditions                  []longhornv1beta2.Condition
		wantRoom                    int64
		wantEligible                bool
		wantWarn                    string
	}{
		// 100 GiB disk, 30 reserved: scheduling allows 70, 10 already scheduled → 60; available
		// 80 less the 25 kept free → 55.
		{"roomy", 100 * gib, 30 * gib, 80 * gib, 10 * gib, true, true, false, ready, 55 * gib, true, ""},
		{"scheduled full", 100 * gib, 30 * gib, 80 * gib, 68 * gib, true, true, false, ready, 2 * gib, true, "less than 5.0 GiB"},
		{"exactly 5Gi", 100 * gib, 30 * gib, 80 * gib, 65 * gib, true, true, false, ready, 5 * gib, true, ""},
		{"disk nearly full", 100 * gib, 30 * gib, 26 * gib, 0, true, true, false, ready, 1 * gib, true, "1.0 GiB available"},
		{"below the minimum", 100 * gib, 30 * gib, 20 * gib, 0, true, true, false, ready, 0, true, "0 B available"},
		{"disk disallows scheduling", 100 * gib, 30 * gib, 80 * gib, 0, false, true, false, ready, 55 * gib, false, "no Longhorn disk is eligible"},
		{"node disallows scheduling", 100 * gib, 30 * gib, 80 * gib, 0, true, false, false, ready, 55 * gib, false, "no Longhorn disk is eligible"},
		{"evicting", 100 * gib, 30 * gib, 80 * gib, 0, true, true, true, ready, 55 * gib, false, "no Longhorn disk is eligible"},
		{"not ready", 100 * gib, 30 * gib, 80 * gib, 0, true, true, false, nil, 55 * gib, false, "no Longhorn disk is eligible"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &longhornv1beta2.Node{}
			n.Spec.AllowScheduling = tt.nodeAllow
			n.Spec.Disks = map[string]longhornv1beta2.DiskSpec{"default": {Path: "/var/lib/longhorn", AllowScheduling: tt.allow, EvictionRequested: tt.evict, StorageReserved: tt.reserved}}
			n.Status.DiskStatus = map[string]*longhornv1beta2.DiskStatus{"default": {StorageMaximum: tt.max, StorageAvailable: tt.avail, StorageScheduled: tt.sched, Conditions: tt.conditions}}
			disks, roomiest := longhornDisks(n, s)
			if len(disks) != 1 || *disks[0].SchedulableBytes != tt.wantRoom || *disks[0].Eligible != tt.wantEligible {
				t.Fatalf("disks %+v (room %d, eligible %v)", disks, *disks[0].SchedulableBytes, *disks[0].Eligible)
			}
			w := longhornLow(roomiest)
			if (tt.wantWarn == "") != (w == "") || !strings.Contains(w, tt.wantWarn) {
				t.Fatalf("warning %q, want %q", w, tt.wantWarn)
			}
		})
	}
	// The roomiest eligible disk decides.
	n := &longhornv1beta2.Node{}
	n.Spec.AllowScheduling = true
	n.Spec.Disks = map[string]longhornv1beta2.DiskSpec{
		"small": {AllowScheduling: true}, "big": {AllowScheduling: true}, "off": {AllowScheduling: false},
	}
	n.Status.DiskStatus = map[string]*longhornv1beta2.DiskStatus{
		"small": {StorageMaximum: 20 * gib, StorageAvailable: 10 * gib, Conditions: ready},
		"big":   {StorageMaximum: 200 * gib, StorageAvailable: 150 * gib, Conditions: ready},
		"off":   {StorageMaximum: 2000 * gib, StorageAvailable: 2000 * gib, Conditions: ready},
	}
	if _, roomiest := longhornDisks(n, s); roomiest != 100*gib {
		t.Fatalf("roomiest %d", roomiest)
	}
}

func TestCheckStorage(t *testing.T) {
	local := storageClass{name: LocalPathClass, provisioner: "rancher.io/local-path", isDefault: true}
	notDefault := local
	notDefault.isDefault = false
	longhornClass := storageClass{name: "longhorn", provisioner: "driver.longhorn.io", isDefault: true}
	tests := []struct {
		name   string
		mode   string
		f      storageFacts
		want   CheckStatus
		detail string
		fix    string
	}{
		{"local as recorded", cluster.StorageLocal, storageFacts{crds: true, classes: []storageClass{local}}, StatusOK, "local-path is the default", ""},
		{"local without the class", cluster.StorageLocal, storageFacts{}, StatusFail, "no local-path StorageClass", "systemctl restart k3s"},
		{"local not default", cluster.StorageLocal, storageFacts{classes: []storageClass{notDefault, longhornClass}}, StatusFail, "(longhorn is)", "kubectl patch storageclass local-path"},
		{"local, no default at all", cluster.StorageLocal, storageFacts{classes: []storageClass{notDefault}}, StatusFail, "(no class is)", "is-default-class"},
		{"local with Longhorn installed", cluster.StorageLocal, storageFacts{namespace: true, classes: []storageClass{local}}, StatusWarn, "did not finish", "kip cluster storage longhorn"},
		{"longhorn as recorded", cluster.StorageLonghorn, storageFacts{namespace: true, crds: true, helmKnown: true, helmChart: true}, StatusOK, "and HelmChart are installed", ""},
		{"longhorn without HelmChart CRD", cluster.StorageLonghorn, storageFacts{namespace: true, crds: true}, StatusOK, "its CRDs are installed", ""},
		{"longhorn missing", cluster.StorageLonghorn, storageFacts{crds: true, helmKnown: true}, StatusFail, "missing namespace longhorn-system, HelmChart longhorn", "kip cluster storage longhorn"},
		{"longhorn CRDs missing", cluster.StorageLonghorn, storageFacts{namespace: true}, StatusFail, "missing Longhorn's CRDs", ""},
		{"unknown mode", "ceph", storageFacts{}, StatusWarn, "unknown storage mode", "upgrade kip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := checkStorage(tt.mode, tt.f)
			if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || !strings.Contains(c.Fix, tt.fix) {
				t.Fatalf("%s %q fix %q", c.Status, c.Detail, c.Fix)
			}
		})
	}
}

func TestHostChecksSmall(t *testing.T) {
	if c := checkWireGuard("w1", sshx.ModuleUnavailable, cluster.NetworkWireGuard); c.Status != StatusFail {
		t.Errorf("wireguard network without the module: %s", c.Status)
	}
	if c := checkWireGuard("w1", sshx.ModuleUnavailable, cluster.NetworkVXLAN); c.Status != StatusWarn {
		t.Errorf("vxlan without the module: %s", c.Status)
	}
	if c := checkWireGuard("w1", sshx.ModuleLoadable, cluster.NetworkVXLAN); c.Status != StatusOK || strings.Contains(c.Detail, "kip upgrade") ||
		!strings.Contains(c.Detail, "re-running kip install keeps it") {
		t.Errorf("vxlan with the module: %s %q", c.Status, c.Detail)
	}
	for _, tt := range []struct {
		fw   host.FirewallState
		want CheckStatus
	}{
		{host.FirewallState{}, StatusOK},
		{host.FirewallState{Tool: "ufw"}, StatusOK},
		{host.FirewallState{Tool: "ufw", Active: true, Managed: true}, StatusOK},
		{host.FirewallState{Tool: "firewalld", Active: true}, StatusWarn},
		{host.FirewallState{Tool: "ufw", Active: true, Managed: true, Unbound: true}, StatusWarn},
	} {
		if c := checkFirewall("srv", "203.0.113.10", tt.fw, true, 22); c.Status != tt.want {
			t.Errorf("firewall %+v: %s", tt.fw, c.Status)
		}
	}
	// An older kip's rules: the command that applies kip's rules now, which exists.
	older := host.FirewallState{Tool: "ufw", Active: true, Managed: true, Unbound: true}
	if c := checkFirewall("srv", "203.0.113.10", older, true, 22); !strings.HasPrefix(c.Fix, "run 'kip install --host 203.0.113.10' again, which applies kip's rules now (every port from 10.42.0.0/16 on cni0") {
		t.Errorf("server firewall with an older kip's rules: fix %q", c.Fix)
	}
	if c := checkFirewall("w1", "203.0.113.51", older, false, 22); !strings.HasPrefix(c.Fix, "run 'kip node add 203.0.113.51' again") ||
		!strings.Contains(c.Detail, "trust the pod and service networks on every interface") {
		t.Errorf("worker firewall with an older kip's rules: %q, fix %q", c.Detail, c.Fix)
	}
	// A server's fix lists exactly what kip writes into a firewall it manages.
	if c := checkFirewall("srv", "203.0.113.10", host.FirewallState{Tool: "firewalld", Active: true}, true, 2222); c.Fix != "make sure firewalld lets in "+host.Describe(host.ServerRules(2222)) {
		t.Errorf("server firewall fix %q", c.Fix)
	}
	// A worker's names the peer ports and the pod network's rules, on the pod network's interfaces.
	if c := checkFirewall("w1", "203.0.113.51", host.FirewallState{Tool: "ufw", Active: true}, false, 22); c.Fix != "allow the cluster's ports in ufw yourself: "+
		"10250/tcp, 51820/udp and 9100/tcp from the other nodes, every port from 10.42.0.0/16 on cni0, flannel-wg and flannel.1, "+
		"every port from 10.43.0.0/16 on cni0, flannel-wg and flannel.1" {
		t.Errorf("worker firewall fix %q", c.Fix)
	}
	el97 := &sshx.Facts{OS: sshx.OS{ID: "rocky", VersionID: "9.7"}, Kernel: "5.14.0-611.5.1.el9_7.x86_64"}
	if c := checkLonghornOS("w1", el97); c.Status != StatusWarn || !strings.Contains(c.Detail, "issue 13606") {
		t.Errorf("rocky 9.7: %s %q", c.Status, c.Detail)
	}
	el96 := &sshx.Facts{OS: sshx.OS{ID: "rocky", VersionID: "9.6", PrettyName: "Rocky Linux 9.6"}, Kernel: "5.14.0-570.12.1.el9_6.x86_64"}
	if c := checkLonghornOS("w1", el96); c.Status != StatusOK {
		t.Errorf("rocky 9.6: %s %q", c.Status, c.Detail)
	}
}

func TestParseProbe(t *testing.T) {
	leaf := certPEM(t, "kube-apiserver", time.Date(2027, 1, 2, 0, 0, 0, 0, time.UTC), false)
	out := "Welcome to the host\n" +
		"\n@@kip-host clock\n1764590400.250000000\n" +
		"\n@@kip-host cert /var/lib/rancher/k3s/server/tls/serving-kube-apiserver.crt\n" + string(leaf) +
		"\n@@kip-host cert /var/lib/rancher/k3s/agent/empty.crt\n" +
		"\n@@kip-host volumes\n2048\t/var/lib/rancher/k3s/storage/pvc-1_shop_data-db-0/\n4\t/var/lib/rancher/k3s/storage/pvc-2_shop_cache/\n"
	p, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if !p.hasClock || !p.clock.Equal(time.Unix(1764590400, 250_000_000)) {
		t.Errorf("clock %v", p.clock)
	}
	if len(p.certs) != 2 || p.certs[0].err != nil || p.certs[0].certs[0].Subject.CommonName != "kube-apiserver" || p.certs[1].err == nil {
		t.Errorf("certs %+v", p.certs)
	}
	if !p.hasVolumes || len(p.volumes) != 2 || p.volumes[0].bytes != 2<<20 || p.volumes[0].path != "/var/lib/rancher/k3s/storage/pvc-1_shop_data-db-0" {
		t.Errorf("volumes %+v", p.volumes)
	}
	pv, ns, claim := volumeDir(p.volumes[0].path)
	if pv != "pvc-1" || ns != "shop" || claim != "data-db-0" {
		t.Errorf("volumeDir: %s %s %s", pv, ns, claim)
	}
	for _, bad := range []string{"\n@@kip-host nope\n", "\n@@kip-host clock\nnoon\n", "\n@@kip-host volumes\nlots\t/x\n"} {
		if _, err := parseProbe(bad); err == nil {
			t.Errorf("parseProbe(%q) succeeded", bad)
		}
	}
	for s, want := range map[string]time.Time{
		"1764590400.%N\n": time.Unix(1764590400, 0), // a date without %N
		"1764590400.N":    time.Unix(1764590400, 0),
		"1764590400":      time.Unix(1764590400, 0),
		"1764590400.5":    time.Unix(1764590400, 500_000_000),
	} {
		if got, err := parseClock(s); err != nil || !got.Equal(want) {
			t.Errorf("parseClock(%q) = %v, %v", s, got, err)
		}
	}
}

// TestScriptSyntax checks the embedded host script with sh -n, and with shellcheck where it is
// installed.
func TestScriptSyntax(t *testing.T) {
	if out, err := exec.Command("sh", "-n", "hostchecks.sh").CombinedOutput(); err != nil {
		t.Errorf("sh -n hostchecks.sh: %v: %s", err, out)
	}
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", "-s", "sh", "hostchecks.sh").CombinedOutput(); err != nil {
			t.Errorf("shellcheck hostchecks.sh: %v: %s", err, out)
		}
	}
}

// TestScriptLocally runs the script here, without SSH, on certificates and volumes it places.
func TestScriptLocally(t *testing.T) {
	dir := t.TempDir()
	tls, storage := filepath.Join(dir, "tls"), filepath.Join(dir, "storage")
	for _, d := range []string{tls, filepath.Join(storage, "pvc-1_shop_data-db-0"), filepath.Join(storage, "pvc 2_odd name_x")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tls, "client-admin.crt"), certPEM(t, "admin", time.Now().Add(time.Hour), false), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(storage, "pvc-1_shop_data-db-0", "data"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", hostScript, "kip-host", "clock", "certs="+tls, "certs="+filepath.Join(dir, "missing"), "volumes="+storage).Output()
	if err != nil {
		t.Fatal(err)
	}
	p, err := parseProbe(string(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := time.Since(p.clock); d.Abs() > 5*time.Second || p.clock.Nanosecond() == 0 {
		t.Errorf("clock %v (now %v)", p.clock, time.Now())
	}
	if len(p.certs) != 1 || p.certs[0].err != nil || p.certs[0].path != filepath.Join(tls, "client-admin.crt") {
		t.Errorf("certs %+v", p.certs)
	}
	if len(p.volumes) != 2 || p.volumes[1].path != filepath.Join(storage, "pvc-1_shop_data-db-0") || p.volumes[1].bytes < 1<<20 {
		t.Errorf("volumes %+v", p.volumes)
	}
	if err := exec.Command("sh", "-c", hostScript, "kip-host", "bogus").Run(); err == nil {
		t.Error("an unknown request succeeded")
	}
}

func TestOperationResume(t *testing.T) {
	for startedBy, want := range map[string]string{
		"kip node add 203.0.113.11 by alice@laptop, pid 4242":             "kip node add 203.0.113.11",
		"kip service storage longhorn db --project shop by bob@ci, pid 1": "kip service storage longhorn db --project shop",
		"something else": "",
	} {
		op := operation(workflow.Progress{Workflow: "x", StartedBy: startedBy})
		if op.Resume != want {
			t.Errorf("%q: resume %q, want %q", startedBy, op.Resume, want)
		}
	}
}
