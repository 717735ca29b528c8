package sink

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/modelsphere/autoconfig/compiler"
)

// TestSeenTellsOwnAndForeignChanges: the controller watches ConfigMaps as
// metadata only, so which keys an event changed comes from the Writer: the
// keys of its own writes without any read, another writer's changes by one
// read of the version it does not know, and All for a ConfigMap it never
// read.
func TestSeenTellsOwnAndForeignChanges(t *testing.T) {
	ns := setup(t, map[string]string{"base.conf": "keep", "other.conf": "o"}, nil)
	ctx := context.Background()
	ref := ns + "/cm"
	api := &countingReader{Reader: k8s}
	w := &Writer{Client: k8s, APIReader: api, Window: 5 * time.Millisecond}

	ch, err := w.Seen(ctx, ref, get(t, ns).ResourceVersion)
	if err != nil || !ch.All || api.n.Load() != 0 {
		t.Fatalf("a ConfigMap never read: %+v %v, %d reads; want All and no read", ch, err, api.n.Load())
	}

	// Our write: its keys, no read.
	if res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "A")}, nil); err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	reads := api.n.Load()
	ch, err = w.Seen(ctx, ref, get(t, ns).ResourceVersion)
	if err != nil || ch.All || !slices.Equal(slices.Sorted(maps.Keys(ch.Keys)), []string{"a.conf"}) || *ch.Keys["a.conf"] != "A" {
		t.Fatalf("after our write: %+v %v, want a.conf=A", ch, err)
	}
	if api.n.Load() != reads {
		t.Fatalf("Seen of our own write read the ConfigMap (%d reads)", api.n.Load()-reads)
	}

	// Someone else changes one key and removes another: one read, both
	// keys told; told once.
	cur := get(t, ns)
	cur.Data["base.conf"] = "edited"
	delete(cur.Data, "other.conf")
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	ch, err = w.Seen(ctx, ref, cur.ResourceVersion)
	if err != nil || ch.All || len(ch.Keys) != 2 || *ch.Keys["base.conf"] != "edited" || ch.Keys["other.conf"] != nil {
		t.Fatalf("after a foreign write: %+v %v, want base.conf=edited and other.conf removed", ch, err)
	}
	if n := api.n.Load() - reads; n != 1 {
		t.Fatalf("%d reads for a foreign write, want 1", n)
	}
	if ch, _ = w.Seen(ctx, ref, cur.ResourceVersion); len(ch.Keys) != 0 || ch.All {
		t.Fatalf("the same version again: %+v, want nothing", ch)
	}

	// A foreign write the Writer read while deciding (its batch saw a
	// version it did not know) is still told to the event's Seen.
	cur = get(t, ns)
	cur.Data["other.conf"] = "back"
	if err := k8s.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if res, err := w.Apply(ctx, ns, []compiler.Output{out(ns, "a.conf", "A2")}, nil); err != nil || res[0].State != Written {
		t.Fatalf("%v %v", res, err)
	}
	ch, err = w.Seen(ctx, ref, cur.ResourceVersion)
	if err != nil || len(ch.Keys) != 2 || *ch.Keys["other.conf"] != "back" || *ch.Keys["a.conf"] != "A2" {
		t.Fatalf("a foreign write read by a batch: %+v %v, want other.conf=back and a.conf=A2", ch, err)
	}
}
