package hagate

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

type upProbe struct{}

func (upProbe) Probe(context.Context) error { return nil }

// A restarted leader (same identity, Lease still its own, pod still
// labelled) whose election decides for it between the pass's two reads of
// the election state keeps its label. The race is staged: the elector's
// first Lease read is held until the pass has read "not leader", then the
// pass waits until client-go records the leadership. (The end-to-end
// TestRestartedLeaderKeepsLabel in cmd/hagate hit this window once in
// seven runs on a loaded machine.) A fake clientset is enough here: what is
// under test is the order of the gate's own reads.
func TestLeadershipDecidedMidPassKeepsLabel(t *testing.T) {
	// "own name read": client-go's IsLeader is true as soon as its Get
	// shows our own name, before the renewal (held back here) is written.
	t.Run("own name read, renewal in flight", func(t *testing.T) { stageMidPassDecision(t, false) })
	// "renewed": the renewal succeeded and client-go recorded leadership.
	t.Run("renewed", func(t *testing.T) { stageMidPassDecision(t, true) })
}

func stageMidPassDecision(t *testing.T, renewed bool) {
	ctx := context.Background()
	const ns, pod, lease, label = "ns", "router-a", "router-ha", "router-active"
	id, dur, now := pod, int32(15), metav1.NewMicroTime(time.Now())
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: map[string]string{label: "true"}}},
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lease},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now}},
	)
	// The fake clientset holds its lock while a reactor runs, so only the
	// Lease read is held back there (nothing else is in flight then); the
	// renewal is held back in the gate's own lock wrapper.
	getLease, updateLease := make(chan struct{}), make(chan struct{})
	cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-getLease
		return false, nil, nil // on to the object tracker
	})
	var patches []string
	cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patches = append(patches, string(a.(k8stesting.PatchAction).GetPatch()))
		return false, nil, nil
	})
	if renewed {
		close(updateLease)
	}
	g, err := New(Config{Client: cs, Namespace: ns, PodName: pod, LeaseName: lease, LabelKey: label,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Interval: time.Second, App: upProbe{}})
	if err != nil {
		t.Fatal(err)
	}
	g.beforeLeaseWrite = func() { <-updateLease }
	defer g.stopElection()
	staged := false
	var once sync.Once
	g.afterLeaderRead = func(leader bool) {
		once.Do(func() {
			if leader {
				return
			}
			staged = true
			close(getLease)
			deadline := time.Now().Add(10 * time.Second)
			for !g.el.le.IsLeader() || (renewed && g.el.lock.renewedAt().IsZero()) {
				if time.Now().After(deadline) {
					t.Error("the election did not get to the staged state within 10s")
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	err = g.reconcile(ctx, true, "")
	if !renewed {
		close(updateLease)
	}
	if len(patches) > 0 {
		t.Fatalf("the restarted leader patched its pod mid-decision (it must keep its label): %v", patches)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !staged {
		t.Fatal("the pass read leadership only after the election decided: the race was not staged")
	}
	got, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[label] != "true" {
		t.Fatalf("the restarted leader dropped its label (labels %v)", got.Labels)
	}
}
