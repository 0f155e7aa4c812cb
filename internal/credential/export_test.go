package credential

import (
	"context"

	"kipper.run/kip/internal/kube"
)

// What the API tests (package credential_test) call of the writes.

// Seed is seed: grant g on credential c as read (at its resourceVersion then), re-read on a
// conflict.
func Seed(ctx context.Context, cl *kube.Clients, c Credential, g Grant) (left string, err error) {
	return seed(ctx, cl, c, g)
}
