package backup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNames(t *testing.T) {
	at := now.Add(3*3600e9 + 15*60e9)
	if got := backupName(Scope{Project: "shop", Namespaces: []string{"shop-prod", "shop-staging"}}, at); got != "shop-20261202-151500" {
		t.Errorf("project backup name %s", got)
	}
	if got := backupName(Scope{Namespaces: []string{"a", "b"}}, at); got != "kipper-20261202-151500" {
		t.Errorf("several namespaces %s", got)
	}
	long := strings.Repeat("n", 62)
	if got := backupName(Scope{Namespaces: []string{long}}, at); len(got) > 63 {
		t.Errorf("backup name %s is %d long", got, len(got))
	}
	if got := restoreName(strings.Repeat("b", 60), at); len(got) != 63 || !strings.HasSuffix(got, "-restore-20261202-151500") {
		t.Errorf("restore name %s (%d)", got, len(got))
	}
	if got := drillCopyName(strings.Repeat("x", 63)); len(got) != 63 || !strings.HasSuffix(got, "-drill") {
		t.Errorf("drill copy %s", got)
	}
}

func TestParseMapping(t *testing.T) {
	m, err := ParseMapping("shop-prod:shop-prod-restored, blog:blog-2")
	if err != nil || len(m) != 2 || m["shop-prod"] != "shop-prod-restored" || m["blog"] != "blog-2" {
		t.Fatalf("ParseMapping = %v, %v", m, err)
	}
	for _, bad := range []string{"shop", "a:", ":b", "a:b:c", "a:b,a:c"} {
		if _, err := ParseMapping(bad); err == nil {
			t.Errorf("ParseMapping(%q) accepted", bad)
		}
	}
}

func TestWriteKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	if err := writeKey(file, []byte("s3cret")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", fi.Mode(), err)
	}
	err = writeKey(file, []byte("other"))
	if err == nil || !strings.Contains(err.Error(), "never overwrites") {
		t.Fatalf("second write: %v", err)
	}
	if got, _ := os.ReadFile(file); string(got) != "s3cret" {
		t.Errorf("the key file was changed to %q", got)
	}
}

func TestMountedSecret(t *testing.T) {
	pod := &corev1.PodSpec{
		Volumes: []corev1.Volume{
			{Name: "plugins"},
			{Name: "sse", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "velero-sse-c",
				Items: []corev1.KeyToPath{{Key: "customer-key", Path: "key.bin"}}}}},
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "velero-credentials"}}},
		},
		Containers: []corev1.Container{{Name: "velero", VolumeMounts: []corev1.VolumeMount{
			{Name: "plugins", MountPath: "/plugins"}, {Name: "sse", MountPath: "/keys"}, {Name: "creds", MountPath: "/credentials"}}}},
	}
	if s, k, err := mountedSecret(pod, "/keys/key.bin"); err != nil || s != "velero-sse-c" || k != "customer-key" {
		t.Errorf("mapped item: %s %s %v", s, k, err)
	}
	if s, k, err := mountedSecret(pod, "/credentials/cloud"); err != nil || s != "velero-credentials" || k != "cloud" {
		t.Errorf("whole secret: %s %s %v", s, k, err)
	}
	if _, _, err := mountedSecret(pod, "/plugins/x"); err == nil {
		t.Error("a file on a volume that is not a Secret was accepted")
	}
}
