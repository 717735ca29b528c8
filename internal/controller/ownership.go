package controller

// This file: who may write which ConfigMap key. Every key autoconfig
// writes carries an ownership mark naming its route (compiler.ReadContent).
// A route writes a key only when the key is absent, free (the CART chart's
// empty workers placeholder), marked with its own name, or marked by a
// route that is gone; and of several routes that may, only the oldest
// (creationTimestamp, then namespace/name). A key without a mark was
// written by a person or another tool: it is taken over only with the
// route's adopt-foreign-keys annotation. A route removes only keys marked
// with its own name, whatever status.outputs says.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/modelsphere/autoconfig/compiler"
	"github.com/modelsphere/autoconfig/internal/discovery"
	"github.com/modelsphere/autoconfig/internal/informer"
	"github.com/modelsphere/autoconfig/internal/sink"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// AdoptForeignKeysAnnotation on a ModelRoute, set to "true", lets the route
// take over keys it renders that exist without an ownership mark (a file
// maintained by hand before autoconfig, e.g. session_route_legacy.conf).
// Once written, the key carries the route's mark and the annotation can be
// removed. It never takes a key from another route.
const AdoptForeignKeysAnnotation = "routing.modelsphere.dev/adopt-foreign-keys"

// IndexRouteOutputKey indexes ModelRoutes by every key they write, as
// "ns/configmap|key" (otherRouteKeys: with dynamic peers, so the peers
// table key too): the routes claiming one key.
const IndexRouteOutputKey = "route.routing.modelsphere.dev/output-key"

// IndexRouteMonitorConfigMap indexes ModelRoutes by their monitor output
// ConfigMap (ns/name): the routes to re-check when a route starts or stops
// writing nginx files into a ConfigMap.
const IndexRouteMonitorConfigMap = "route.routing.modelsphere.dev/monitor-configmap"

// SetupOwnershipIndex registers IndexRouteOutputKey and
// IndexRouteMonitorConfigMap.
func SetupOwnershipIndex(ctx context.Context, idx client.FieldIndexer) error {
	err := idx.IndexField(ctx, &v1alpha1.ModelRoute{}, IndexRouteOutputKey, func(o client.Object) []string {
		rt, ok := o.(*v1alpha1.ModelRoute)
		if !ok {
			return nil
		}
		return outputKeyValues(rt)
	})
	if err != nil {
		return err
	}
	return idx.IndexField(ctx, &v1alpha1.ModelRoute{}, IndexRouteMonitorConfigMap, func(o client.Object) []string {
		rt, ok := o.(*v1alpha1.ModelRoute)
		if !ok {
			return nil
		}
		if cm := otherRouteKeys(rt).Monitor.ConfigMap; cm != "" {
			return []string{cm}
		}
		return nil
	})
}

// otherRouteKeys is what the key guard asks the compiler about a route
// other than the one it guards (one the cache's indexes or a key's mark
// name): its keys from its spec alone, with dynamic peers (the peers table
// key too), and how its marks name it. The guarded route's own keys come
// with its compile (compiler.Result.Keys).
func otherRouteKeys(rt *v1alpha1.ModelRoute) compiler.Keys {
	return compiler.KeysFor(compilerRoute(rt), true)
}

// keyGuard decides who may write a key: the ownership marks in the
// ConfigMap's content and the routes' claims (the file comment), read
// through client; trusted are the --trusted-namespace values.
type keyGuard struct {
	client  client.Reader
	trusted []string
}

// nginxConfigMapUser returns a route (ns/name) whose nginx output is cm,
// preferring the route whose keys are own ("" = none): openresty includes
// every *.conf key of that ConfigMap, so a monitor file must never go
// there.
func (g keyGuard) nginxConfigMapUser(ctx context.Context, own compiler.Keys, cm string) string {
	if own.NginxConfigMap == cm {
		return own.Owner
	}
	for _, rt := range informer.RoutesBy(ctx, g.client, discovery.IndexRouteConfigMap, cm) {
		if !rt.DeletionTimestamp.IsZero() {
			continue
		}
		if other := otherRouteKeys(&rt); other.NginxConfigMap == cm {
			return other.Owner
		}
	}
	return ""
}

// dropUnsafeMonitor removes the monitor output when its ConfigMap is an
// nginx output ConfigMap (of this route or another), and says so. A
// monitor key the route wrote there before is then removed as stale.
func (g keyGuard) dropUnsafeMonitor(ctx context.Context, st *state, outputs []compiler.Output) []compiler.Output {
	mon := st.result.Keys.Monitor
	if mon.ConfigMap == "" {
		return outputs
	}
	cm, key := mon.ConfigMap, mon.Key
	user := g.nginxConfigMapUser(ctx, st.result.Keys, cm)
	if user == "" {
		return outputs
	}
	st.blockAt(ReasonMonitorInNginxConfigMap, fmt.Sprintf(
		"spec.monitor.outputConfigMap %s is the nginx output ConfigMap of ModelRoute %s: openresty includes every *.conf key there, so the monitor file %s would be loaded as nginx configuration; nothing is written there (and a monitor file written earlier is removed): write the monitor lines to the monitoring agent's own ConfigMap",
		cm, user, key), false, cm+"|"+key)
	return slices.DeleteFunc(slices.Clone(outputs), func(o compiler.Output) bool { return o.ConfigMap == cm && o.Key == key })
}

func outputKeyValues(rt *v1alpha1.ModelRoute) []string {
	var out []string
	for _, k := range otherRouteKeys(rt).Outputs {
		out = append(out, k.ConfigMap+"|"+k.Key)
	}
	return out
}

// ConflictError: another route owns the key, or has the better claim to it.
type ConflictError struct {
	ConfigMap, Key string
	// Owner is the route (ns/name) that keeps the key.
	Owner string
	// Holds: the owner's content is in the key (else the owner is older
	// and the key is still unwritten).
	Holds bool
	// Field is this route's spec field that names the key.
	Field string
}

func (e *ConflictError) Error() string {
	how := "holds it"
	if !e.Holds {
		how = "claims it too and is older"
	}
	return fmt.Sprintf("key %s of ConfigMap %s belongs to ModelRoute %s, which %s; this route writes nothing there (change %s to render another key, or delete %s)",
		e.Key, e.ConfigMap, e.Owner, how, e.Field, e.Owner)
}

// ForeignError: the key exists without an ownership mark.
type ForeignError struct {
	ConfigMap, Key, Field string
}

func (e *ForeignError) Error() string {
	if e.Key == compiler.CartKey {
		return fmt.Sprintf("key %s of ConfigMap %s was not written by autoconfig and is not a CART base config with an empty workers list; it is left untouched (point %s at the CART chart's ConfigMap, or annotate the route %s=true to take it over)",
			e.Key, e.ConfigMap, e.Field, AdoptForeignKeysAnnotation)
	}
	return fmt.Sprintf("key %s of ConfigMap %s exists and was not written by autoconfig (no ownership mark); it is left untouched (annotate the route %s=true to take it over, e.g. when migrating a hand-maintained file, or change %s)",
		e.Key, e.ConfigMap, AdoptForeignKeysAnnotation, e.Field)
}

// write decides per key whether route, whose keys are own (its compile's
// Result.Keys), may write it (package comment).
func (g keyGuard) write(ctx context.Context, route *v1alpha1.ModelRoute, own compiler.Keys) sink.Guard {
	me := own.Owner
	fields := map[string]string{}
	for _, k := range own.Outputs {
		fields[k.ConfigMap+"|"+k.Key] = k.Field
	}
	adopt := route.Annotations[AdoptForeignKeysAnnotation] == "true"
	legacy := ownedFromStatus(route.Status.Outputs)
	return func(cm *corev1.ConfigMap, key string) error {
		ref := cm.Namespace + "/" + cm.Name
		field := fields[ref+"|"+key]
		if v, present := cm.Data[key]; present {
			c := compiler.ReadContent(key, []byte(v))
			switch {
			case c.Owner == me:
				return nil
			case c.Owner != "":
				if alive, err := g.claims(ctx, c.Owner, cm, key); err != nil || alive {
					return &ConflictError{ConfigMap: ref, Key: key, Owner: c.Owner, Holds: true, Field: field}
				}
				// the owner is gone: the key is up for claims
			case c.Free:
			case key == compiler.CartKey && slices.Contains(legacy[ref], key):
				// Written by this route before CART files had marks.
			case !adopt:
				return &ForeignError{ConfigMap: ref, Key: key, Field: field}
			}
		}
		if first := g.firstClaimant(ctx, route, me, cm, key); first != me {
			return &ConflictError{ConfigMap: ref, Key: key, Owner: first, Field: field}
		}
		return nil
	}
}

// removeGuard lets a route remove only keys that carry its own mark (me,
// as the marks name it).
func removeGuard(me string) sink.Guard {
	return func(cm *corev1.ConfigMap, key string) error {
		if owner := compiler.ReadContent(key, []byte(cm.Data[key])).Owner; owner != me {
			if owner == "" {
				return fmt.Errorf("not written by autoconfig (no ownership mark): left in place")
			}
			return fmt.Errorf("now written by ModelRoute %s: left in place", owner)
		}
		return nil
	}
}

// claims says whether the route named ref (ns/name) exists, is not being
// deleted, renders key into cm and may write cm. A read error other than
// not-found is returned (the caller then keeps the owner).
func (g keyGuard) claims(ctx context.Context, ref string, cm *corev1.ConfigMap, key string) (bool, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return false, nil
	}
	var rt v1alpha1.ModelRoute
	if err := g.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &rt); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return claimant(&rt, cm, key, g.trusted), nil
}

// claimant: rt is live, renders key into cm, and may write cm.
func claimant(rt *v1alpha1.ModelRoute, cm *corev1.ConfigMap, key string, trusted []string) bool {
	return rt.DeletionTimestamp.IsZero() && sink.Granted(cm, rt.Namespace, trusted) &&
		slices.Contains(outputKeyValues(rt), cm.Namespace+"/"+cm.Name+"|"+key)
}

// firstClaimant is the route (ns/name) with the best claim on an unowned
// key: the oldest live claimant, then by namespace/name. route (its marks
// name it me) counts as a claimant even before the cache has it.
func (g keyGuard) firstClaimant(ctx context.Context, route *v1alpha1.ModelRoute, me string, cm *corev1.ConfigMap, key string) string {
	best := route
	for _, rt := range informer.RoutesBy(ctx, g.client, IndexRouteOutputKey, cm.Namespace+"/"+cm.Name+"|"+key) {
		if rt.UID == route.UID || !claimant(&rt, cm, key, g.trusted) {
			continue
		}
		if older(&rt, best) {
			best = &rt
		}
	}
	if best == route {
		return me
	}
	return otherRouteKeys(best).Owner
}

// older orders routes by creationTimestamp, then namespace/name.
func older(a, b *v1alpha1.ModelRoute) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}
