package controller

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/modelsphere/autoconfig/internal/peers"
)

// TestDynamicPeersFollowTheConfigMapAnnotation: a routes ConfigMap that
// declares dynamic peers gets each route as two keys; endpoint changes
// rewrite only the peers table (the route file keeps its bytes, so the
// consumer never reloads for them); removing the annotation renders the
// static route file again and removes the table; deleting the route
// removes both keys.
func TestDynamicPeersFollowTheConfigMapAnnotation(t *testing.T) {
	ns := namespace(t, "dyn")
	startManager(t, ns)
	configMap(t, ns, "routes", nil, map[string]string{peers.Annotation: "true"})
	service(t, ns, "m", 8000)
	endpointSlice(t, ns, "m-1", "m", discoveryv1.AddressTypeIPv4, 8000, up("10.40.0.1", "10.40.0.2"))
	createRoute(t, newRoute(ns, "dyn", "m"))

	table := waitKey(t, ns, "routes", peers.Key("dyn"), []string{`"host":"10.40.0.1"`, `"host":"10.40.0.2"`, `"owner":"` + ns + `/dyn"`}, nil)
	conf := waitKey(t, ns, "routes", routeKey("dyn"), []string{"register_dynamic_route"}, []string{"10.40.0.1"})
	first, err := peers.Parse([]byte(table))
	if err != nil {
		t.Fatal(err)
	}

	// Scale out, replace, scale in: only the table changes.
	for _, ips := range [][]string{{"10.40.0.1", "10.40.0.2", "10.40.0.3"}, {"10.40.0.2", "10.40.0.4"}, {"10.40.0.4"}} {
		endpointSlice(t, ns, "m-1", "m", discoveryv1.AddressTypeIPv4, 8000, up(ips...))
		var want, notWant []string
		for _, ip := range ips {
			want = append(want, `"host":"`+ip+`"`)
		}
		for _, ip := range []string{"10.40.0.1", "10.40.0.2", "10.40.0.3"} {
			if !slices.Contains(ips, ip) {
				notWant = append(notWant, `"host":"`+ip+`"`)
			}
		}
		waitKey(t, ns, "routes", peers.Key("dyn"), want, notWant)
		if now, _ := cmKey(t, ns, "routes", routeKey("dyn")); now != conf {
			t.Fatalf("the route file changed with the endpoints %v:\n%s\nwas:\n%s", ips, now, conf)
		}
	}
	if now, _ := cmKey(t, ns, "routes", peers.Key("dyn")); now == table {
		t.Fatal("the peers table did not change")
	} else if tab, err := peers.Parse([]byte(now)); err != nil || tab.Version == first.Version {
		t.Fatalf("table %v, version %q (first %q)", err, tab.Version, first.Version)
	}

	// The consumer no longer declares it: static file, no table.
	declareDynamic(t, ns, "routes", false)
	waitKey(t, ns, "routes", routeKey("dyn"), []string{host("10.40.0.4"), "register_route"}, []string{"register_dynamic_route"})
	eventually(t, "the peers table removed", func() (bool, string) {
		_, ok := cmKey(t, ns, "routes", peers.Key("dyn"))
		return !ok, "still there"
	})

	// Declared again, then the route is deleted: both keys go.
	declareDynamic(t, ns, "routes", true)
	waitKey(t, ns, "routes", peers.Key("dyn"), []string{`"host":"10.40.0.4"`}, nil)
	must(t, k8s.Delete(context.Background(), getRoute(t, ns, "dyn")))
	eventually(t, "both keys removed", func() (bool, string) {
		cm, err := getCM(t, ns, "routes")
		if err != nil {
			return false, err.Error()
		}
		_, a := cm.Data[routeKey("dyn")]
		_, b := cm.Data[peers.Key("dyn")]
		return !a && !b, "keys still there"
	})
}

// declareDynamic sets or removes the dynamic-peers annotation of a
// ConfigMap, as the consumer's chart would.
func declareDynamic(t *testing.T, ns, name string, on bool) {
	t.Helper()
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cm corev1.ConfigMap
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &cm); err != nil {
			return err
		}
		if on {
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			cm.Annotations[peers.Annotation] = "true"
		} else {
			delete(cm.Annotations, peers.Annotation)
		}
		return k8s.Update(context.Background(), &cm)
	}))
}
