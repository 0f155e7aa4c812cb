package components

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"kipper.run/kip/internal/kube"
	"kipper.run/kip/internal/moveguard"
	"kipper.run/kip/manifests"
)

// What kip install applies, as data: Components lists the components of a cluster in install order,
// each with the objects kip server-side applies on every run, the objects it only ever creates, the
// objects it applies once the component is ready, and a readiness check. docs/components.md is the
// operator's view of this file.
//
// Most components are Helm charts that k3s's embedded helm-controller installs from a
// helm.cattle.io/v1 HelmChart in kube-system; kip's own objects (CRDs, namespaces, RBAC, the
// console) are plain manifests.

func (r *renderer) kipperCRDs() (Component, error) {
	docs, err := manifests.CRDs()
	if err != nil {
		return Component{}, err
	}
	c := Component{Name: "kipper-crds", Version: r.o.KipVersion}
	for _, doc := range docs {
		objs, err := kube.DecodeManifests(doc)
		if err != nil {
			return Component{}, fmt.Errorf("kipper CRDs: %w", err)
		}
		for _, obj := range objs {
			labelled(obj)
			if obj.GetName() == "apps.kipper.run" {
				setAnnotation(obj, KipVersionAnnotation, r.o.KipVersion)
			}
			c.Objects = append(c.Objects, obj)
		}
	}
	return c, nil
}

func (r *renderer) kipperBase() (Component, error) {
	c := Component{Name: "kipper-base", Version: r.o.KipVersion, Namespaces: []string{systemNamespace}}
	err := collect(&c.Objects,
		typed("v1", "Namespace", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace}}),
		typed("v1", "ServiceAccount", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace}}),
		typed("rbac.authorization.k8s.io/v1", "ClusterRole", &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kipper-console-api"},
			Rules:      consoleAPIRules(),
		}),
		typed("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kipper-console-api"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kipper-console-api"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "console-api", Namespace: systemNamespace}},
		}),
	)
	if err != nil {
		return Component{}, err
	}
	// The project operator roles console-api binds in a project's namespaces to its members.
	for _, role := range ProjectRoles() {
		if err := collect(&c.Objects, typed("rbac.authorization.k8s.io/v1", "ClusterRole", role)); err != nil {
			return Component{}, err
		}
	}
	// The admission policies a move of a service's data to Longhorn relies on.
	for _, p := range moveguard.Policies() {
		gvk := p.GetObjectKind().GroupVersionKind()
		if err := collect(&c.Objects, typed(gvk.GroupVersion().String(), gvk.Kind, p)); err != nil {
			return Component{}, err
		}
	}
	if r.o.AdminEmail != "" {
		// The API server knows an operator by the email claim of their Dex login.
		err := collect(&c.CreateOnly, typed("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: initialAdminBinding},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: operatorPrefix + r.o.AdminEmail}},
		}))
		if err != nil {
			return Component{}, err
		}
	}
	return c, nil
}

// The project operator roles, from the least to the most: each holds the one before it.
const (
	ProjectViewerRole   = "kipper-project-viewer"
	ProjectDeployerRole = "kipper-project-deployer"
	ProjectOwnerRole    = "kipper-project-owner"
)

// ProjectRoles are the ClusterRoles console-api binds, with a RoleBinding in each namespace of a
// project, to the project's members (docs/console.md): a viewer reads the project's objects and
// what the console shows of them, never a Secret; a deployer also creates, changes and deletes
// its apps, services and functions and restarts their pods; an owner also manages its Secrets,
// its members' bindings and the Project itself.
func ProjectRoles() []*rbacv1.ClusterRole {
	read := []string{"get", "list", "watch"}
	write := []string{"create", "update", "patch", "delete"}
	viewer := []rbacv1.PolicyRule{
		{APIGroups: []string{"kipper.run"}, Resources: []string{"apps", "services", "functions", "projects"}, Verbs: read},
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/log", "services", "endpoints", "events", "configmaps", "persistentvolumeclaims"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets", "replicasets"}, Verbs: read},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses"}, Verbs: read},
		{APIGroups: []string{"autoscaling"}, Resources: []string{"horizontalpodautoscalers"}, Verbs: read},
	}
	deployer := append(slices.Clone(viewer),
		rbacv1.PolicyRule{APIGroups: []string{"kipper.run"}, Resources: []string{"apps", "services", "functions"}, Verbs: write},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"delete"}},
	)
	owner := append(slices.Clone(deployer),
		rbacv1.PolicyRule{APIGroups: []string{"kipper.run"}, Resources: []string{"projects"}, Verbs: write},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: append(slices.Clone(read), write...)},
		rbacv1.PolicyRule{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"rolebindings"}, Verbs: append(slices.Clone(read), write...)},
	)
	var out []*rbacv1.ClusterRole
	for _, r := range []struct {
		name  string
		rules []rbacv1.PolicyRule
	}{{ProjectViewerRole, viewer}, {ProjectDeployerRole, deployer}, {ProjectOwnerRole, owner}} {
		out = append(out, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: r.name}, Rules: r.rules})
	}
	return out
}

// consoleAPIRules is what console-api may do: run the projects' apps, services, functions and
// builds, read what the console shows, and bind the project operator roles.
func consoleAPIRules() []rbacv1.PolicyRule {
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"kipper.run"}, Resources: []string{"*"}, Verbs: all},
		{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "pods/log", "pods/exec", "services", "endpoints",
			"configmaps", "secrets", "persistentvolumeclaims", "serviceaccounts", "resourcequotas", "limitranges", "events"}, Verbs: all},
		{APIGroups: []string{""}, Resources: []string{"nodes", "persistentvolumes"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/scale", "statefulsets", "statefulsets/scale", "replicasets", "daemonsets"}, Verbs: all},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: all},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses", "networkpolicies"}, Verbs: all},
		{APIGroups: []string{"autoscaling"}, Resources: []string{"horizontalpodautoscalers"}, Verbs: all},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: all},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles", "rolebindings"}, Verbs: all},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}, Verbs: []string{"bind"},
			ResourceNames: []string{ProjectViewerRole, ProjectDeployerRole, ProjectOwnerRole}},
		{APIGroups: []string{"keda.sh", "http.keda.sh"}, Resources: []string{"*"}, Verbs: all},
		{APIGroups: []string{"traefik.io"}, Resources: []string{"middlewares", "ingressroutes", "tlsstores", "tlsoptions"}, Verbs: all},
		{APIGroups: []string{"cert-manager.io"}, Resources: []string{"certificates", "issuers"}, Verbs: all},
		{APIGroups: []string{"velero.io"}, Resources: []string{"backups", "restores", "schedules", "backupstoragelocations", "deletebackuprequests"}, Verbs: all},
		{APIGroups: []string{"helm.cattle.io"}, Resources: []string{"helmcharts"}, Verbs: all},
		{APIGroups: []string{"monitoring.coreos.com"}, Resources: []string{"servicemonitors", "podmonitors"}, Verbs: all},
		{APIGroups: []string{"longhorn.io"}, Resources: []string{"volumes", "replicas", "nodes", "settings"}, Verbs: read},
		{APIGroups: []string{"metrics.k8s.io"}, Resources: []string{"pods", "nodes"}, Verbs: read},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: read},
	}
}

// console is the console and console-api, reached at https://console.<ip>.sslip.io.
func (r *renderer) console() (Component, error) {
	api, err := r.pin("console-api")
	if err != nil {
		return Component{}, err
	}
	ui, err := r.pin("console")
	if err != nil {
		return Component{}, err
	}
	memory := resource.MustParse(r.o.Sizing.Profile.ConsoleAPIMemory) // newRenderer checked it
	c := Component{Name: "console", Version: api.Version, Namespaces: []string{systemNamespace}}
	apiLabels := map[string]string{"app": "console-api"}
	uiLabels := map[string]string{"app": "console"}
	env := []corev1.EnvVar{
		{Name: "DEX_ISSUER", Value: "https://" + r.dexHost},
		{Name: "DEX_CLIENT_ID", Value: consoleClientID},
		{Name: "DEX_CLIENT_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: dexOIDCClientSecret}, Key: "secret"}}},
		{Name: "DEX_REDIRECT_URI", Value: "https://" + r.consoleHost + "/callback"},
		{Name: "CLUSTER_HOST", Value: r.o.ServerAddress},
		{Name: "CLUSTER_DOMAIN", Value: r.domain},
		{Name: "CONSOLE_DOMAIN", Value: r.consoleHost},
		{Name: "DEX_DOMAIN", Value: r.dexHost},
	}
	err = collect(&c.Objects,
		typed("apps/v1", "Deployment", &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: apiLabels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: withKipLabels(apiLabels)},
					Spec: corev1.PodSpec{
						ServiceAccountName: "console-api",
						// console-api holds a powerful ServiceAccount, so its own pod is locked down.
						SecurityContext: &corev1.PodSecurityContext{
							RunAsNonRoot:   ptr.To(true),
							RunAsUser:      ptr.To[int64](65532),
							RunAsGroup:     ptr.To[int64](65532),
							FSGroup:        ptr.To[int64](65532),
							SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
						Containers: []corev1.Container{{
							Name:            "console-api",
							Image:           api.Image + ":" + api.Version,
							ImagePullPolicy: corev1.PullAlways,
							Ports: []corev1.ContainerPort{
								{Name: "http", ContainerPort: consoleAPIPort},
								{Name: "metrics", ContainerPort: consoleAPIMetricsPort},
							},
							Env: env,
							Resources: corev1.ResourceRequirements{
								Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: memory},
								Limits:   corev1.ResourceList{corev1.ResourceMemory: memory},
							},
							SecurityContext: &corev1.SecurityContext{
								RunAsNonRoot:             ptr.To(true),
								AllowPrivilegeEscalation: ptr.To(false),
								ReadOnlyRootFilesystem:   ptr.To(true),
								Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
								SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
							},
							// The root filesystem is read-only: /tmp is the one writable place.
							VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
						}},
						Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					},
				},
			},
		}),
		typed("v1", "Service", &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "console-api", Namespace: systemNamespace},
			Spec: corev1.ServiceSpec{Selector: apiLabels, Ports: []corev1.ServicePort{
				{Name: "http", Port: consoleAPIPort, TargetPort: intstr.FromString("http")},
				{Name: "metrics", Port: consoleAPIMetricsPort, TargetPort: intstr.FromString("metrics")},
			}},
		}),
		typed("apps/v1", "Deployment", &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: uiLabels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: withKipLabels(uiLabels)},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name:            "console",
						Image:           ui.Image + ":" + ui.Version,
						ImagePullPolicy: corev1.PullAlways,
						Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: consolePort}},
					}}},
				},
			},
		}),
		typed("v1", "Service", &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace},
			Spec: corev1.ServiceSpec{Selector: uiLabels, Ports: []corev1.ServicePort{
				{Name: "http", Port: consolePort, TargetPort: intstr.FromString("http")},
			}},
		}),
		typed("networking.k8s.io/v1", "Ingress", &networkingv1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Name: "console", Namespace: systemNamespace,
				Annotations: map[string]string{"cert-manager.io/cluster-issuer": clusterIssuer}},
			Spec: networkingv1.IngressSpec{
				IngressClassName: ptr.To(ingressClass),
				TLS:              []networkingv1.IngressTLS{{Hosts: []string{r.consoleHost}, SecretName: "console-tls"}},
				Rules: []networkingv1.IngressRule{{Host: r.consoleHost, IngressRuleValue: networkingv1.IngressRuleValue{
					HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
						ingressPath("/api", "console-api", consoleAPIPort),
						ingressPath("/auth", "console-api", consoleAPIPort),
						ingressPath("/", "console", consolePort),
					}},
				}}},
			},
		}),
	)
	return c, err
}

func ingressPath(path, service string, port int32) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{
		Path:     path,
		PathType: ptr.To(networkingv1.PathTypePrefix),
		Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
			Name: service, Port: networkingv1.ServiceBackendPort{Number: port}}},
	}
}

// --- charts ------------------------------------------------------------------------------------
