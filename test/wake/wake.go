// Package wake drives a test stand-in's reconcile loop as a controller's watches drive one: a pass
// at the start, another soon after any change to the objects the stand-in looks at, and one at
// least every resync interval. A stand-in that listed everything on a short timer instead kept the
// API server busy for the whole of a test, taking the machine's cores from the tests beside it.
// It is a test tool, never shipped.
package wake

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Loop is one reconcile loop's wake-up call.
type Loop struct{ c chan struct{} }

// New returns a loop that nothing has woken yet.
func New() *Loop { return &Loop{c: make(chan struct{}, 1)} }

// Poke asks for another pass; pokes before the pass starts make one pass.
func (l *Loop) Poke() {
	select {
	case l.c <- struct{}{}:
	default:
	}
}

// Watch pokes l on every change to the objects lw lists and watches (each a typed object's
// example), from now until ctx ends.
func (l *Loop) Watch(ctx context.Context, lw cache.ListerWatcher, example runtime.Object) {
	inf := cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.Poke() },
		UpdateFunc: func(any, any) { l.Poke() },
		DeleteFunc: func(any) { l.Poke() },
	}); err != nil {
		panic(err) // only when the informer has stopped, and it has not started
	}
	go inf.Run(ctx.Done())
}

// WatchResource is Watch for a resource of the dynamic client (namespace "" is all of them).
func (l *Loop) WatchResource(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, namespace string) {
	api := client.Resource(gvr).Namespace(namespace)
	l.Watch(ctx, &cache.ListWatch{
		ListFunc:  func(o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) { return api.Watch(ctx, o) },
	}, &unstructured.Unstructured{})
}

// Run calls pass at once, then after each poke and at least every resync, until ctx ends.
func (l *Loop) Run(ctx context.Context, resync time.Duration, pass func()) {
	t := time.NewTicker(resync)
	defer t.Stop()
	for {
		pass()
		select {
		case <-ctx.Done():
			return
		case <-l.c:
		case <-t.C:
		}
	}
}
