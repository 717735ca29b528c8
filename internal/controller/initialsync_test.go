package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestInitialSyncWritesEachStatusOnce: routes no controller has reconciled
// yet, at a controller's start. The initial sync writes each route's status
// once: the workqueue's pass after it waits for the cache to show those
// writes, instead of reading the routes as they were and writing the same
// status (and event) again. And a first Ready at the start is no event of
// its own (the status says it); a Warning still is.
func TestInitialSyncWritesEachStatusOnce(t *testing.T) {
	ns := namespace(t, "initial")
	configMap(t, ns, "routes", nil, nil)
	const n = 40
	var names []types.NamespacedName
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		service(t, ns, name, 8000)
		endpointSlice(t, ns, name+"-a", name, v4, 8000, up(fmt.Sprintf("10.11.%d.1", i)))
		createRoute(t, newRoute(ns, name, name))
		names = append(names, types.NamespacedName{Namespace: ns, Name: name})
	}
	// One route waits for a Service that does not exist: a Warning.
	createRoute(t, newRoute(ns, "missing", "missing"))

	base := reconciles(t)
	h := startManager(t, ns)
	for _, k := range names {
		waitCondition(t, ns, k.Name, metav1.ConditionTrue, ReasonReconciled)
	}
	waitCondition(t, ns, "missing", metav1.ConditionFalse, ReasonServiceNotFound)
	// Every route reconciled once more by the workers (the initial list).
	waitQuiet(t, h, base, nil, names...)
	if s := h.c.statusWrites.Load(); s != n+1 {
		t.Errorf("%d status writes for %d routes at start, want one each", s, n+1)
	}
	waitEvent(t, ns, "missing", ReasonServiceNotFound)
	time.Sleep(500 * time.Millisecond) // an event, if one were sent, would be listed by now
	var l eventsv1.EventList
	must(t, k8s.List(context.Background(), &l, client.InNamespace(ns)))
	for _, e := range l.Items {
		if e.Reason == ReasonReconciled {
			t.Errorf("event %s on %s at the start: %s", e.Reason, e.Regarding.Name, e.Note)
		}
	}
}
