package k3s

import (
	"fmt"
	"net/netip"

	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"sigs.k8s.io/yaml"
)

// DexAudience is the client ID operators' tokens are issued for.
const DexAudience = "kip"

// PublicHost is the DNS name the cluster's own services hang under for a server reached at
// address: an IP address gets an sslip.io name that resolves to it; a DNS name is used as it is.
func PublicHost(address string) string {
	if ip, err := netip.ParseAddr(address); err == nil {
		return ip.String() + ".sslip.io"
	}
	return address
}

// DexIssuer is the issuer URL of the cluster's Dex, which the API server trusts for operators.
func DexIssuer(address string) string { return "https://dex." + PublicHost(address) }

// AuthenticationConfig renders the API server's authentication configuration: tokens that the
// cluster's Dex issued for kip, the user named by its verified email, prefixed so that no
// token can claim a system: name.
func AuthenticationConfig(address string) ([]byte, error) {
	prefix := "oidc:"
	cfg := apiserverv1.AuthenticationConfiguration{
		JWT: []apiserverv1.JWTAuthenticator{{
			Issuer: apiserverv1.Issuer{URL: DexIssuer(address), Audiences: []string{DexAudience}},
			ClaimMappings: apiserverv1.ClaimMappings{
				Username: apiserverv1.PrefixedClaimOrExpression{Claim: "email", Prefix: &prefix},
				Groups:   apiserverv1.PrefixedClaimOrExpression{Claim: "groups", Prefix: &prefix},
			},
		}},
	}
	cfg.APIVersion, cfg.Kind = apiserverv1.SchemeGroupVersion.String(), "AuthenticationConfiguration"
	body, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("render the API server's authentication configuration: %w", err)
	}
	return append([]byte("# Written by kip: operators log in through the cluster's Dex.\n"), body...), nil
}
