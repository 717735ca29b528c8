// Package served is the format of a consumer pod's served report: the
// annotation its reload sidecar keeps on its own Pod, saying per key which
// content the target process loaded and when. The controller reads it to
// tell which consumer pods serve a route's current output.
//
// The channel is the Pod itself: the sidecar needs no network path from the
// controller, writes nothing into the ConfigMaps, and may change the
// annotation only on its own Pod — the ValidatingAdmissionPolicy the chart
// ships compares the pod name bound into the request's service-account
// token with the Pod being changed.
package served

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Annotation is the Pod annotation holding the Report (JSON).
const Annotation = "routing.modelsphere.dev/served"

// How the target came to serve the content.
const (
	// HowReload: a HUP whose reload was verified (the target's workers
	// were replaced), after the check command passed if one is set.
	HowReload = "reload"
	// HowSignal: the signal was delivered, but the target has no worker
	// processes to show it reloaded (e.g. CART): served as far as a
	// signal can tell.
	HowSignal = "signal"
	// HowStart: the content present when the sidecar started, taken as
	// what the target started with.
	HowStart = "start"
	// HowPush: only peers tables changed, and the engine acknowledged
	// each pushed table's version on its control socket (no reload):
	// every worker picks from it from its next request on.
	HowPush = "push"
)

// IDLen is the length of an ID: the first 16 hex digits (64 bits) of the
// SHA-256, enough to tell versions of one key apart and short enough for a
// thousand keys to fit in an annotation.
const IDLen = 16

// ID is the content identity of a key's bytes.
func ID(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:IDLen/2])
}

// IDOfSum is ID for a SHA-256 already computed.
func IDOfSum(sum [sha256.Size]byte) string { return hex.EncodeToString(sum[:IDLen/2]) }

// Report is what a consumer pod serves.
type Report struct {
	// At is when the target was seen to load the content.
	At time.Time `json:"at"`
	// How is HowReload, HowSignal or HowStart.
	How string `json:"how"`
	// Keys are the ID of each key the target loaded, by key (file name).
	Keys map[string]string `json:"keys"`
	// Peers are, with dynamic peers, the peers table version (peers.Table
	// Version) the engine acknowledged, by route.
	Peers map[string]string `json:"peers,omitempty"`
	// Demand is, for each route whose engine holds requests at zero
	// (spec.scaleToZero), what the engine reports on its control socket
	// (GET /demand): requests waiting now, requests open now and the
	// time of the last request's end. The controller wakes the route's
	// target on waiting requests and, with idleAfter, scales it to 0 once
	// no request is open and the last one ended idleAfter ago.
	Demand map[string]Demand `json:"demand,omitempty"`
	// DemandAt is when the sidecar last read its engine's demand, so the
	// controller can tell a report that stopped (a sidecar that is down)
	// from an idle one: the sidecar rewrites it at least every
	// DemandHeartbeatSteps steps of Demand.Last while it reports any
	// demand, and the controller keeps a workload up (never scales it to
	// 0) while a report of one of its consumer pods is older than
	// DemandStaleSteps steps. Zero: a sidecar that does not keep it
	// (older versions); such a report is never taken as stale.
	DemandAt time.Time `json:"demandAt,omitzero"`
}

// Demand is one route's demand on one consumer pod.
type Demand struct {
	// Waiting is the number of requests the engine holds now (at zero
	// replicas, waiting for a first endpoint).
	Waiting int `json:"waiting"`
	// Open is the number of the route's requests open on the engine now:
	// held, waiting for their first byte, or streaming. The sidecar
	// reports a change between 0 and more at once; other changes of the
	// count ride along with the next change of Last.
	Open int `json:"open,omitempty"`
	// Last is when the route's last request arrived or ended, whichever
	// is later (held or not), to DemandGranularity: the sidecar writes a
	// later time only once it is at least that much later (or at once
	// when Open goes to 0), so the true last request is never more than
	// DemandGranularity after Last. Zero = no request yet.
	Last time.Time `json:"last,omitzero"`
	// StepSeconds is the sidecar's step of Last (--demand-granularity),
	// so the controller knows how much later the true last request may
	// be; 0 = DemandGranularity.
	StepSeconds float64 `json:"stepSeconds,omitempty"`
}

// DemandGranularity is the default step of Demand.Last (the sidecar's
// --demand-granularity): a busy route changes the annotation at most
// once per step, and the controller waits one step more than idleAfter
// before it scales a target to 0.
const DemandGranularity = 10 * time.Second

// The demand's heartbeat, in steps of Demand.Last (Demand.StepSeconds, or
// DemandGranularity): the sidecar rewrites Report.DemandAt at least every
// DemandHeartbeatSteps steps while it reports demand; the controller
// takes a report whose DemandAt is more than DemandStaleSteps steps old
// as stale (its sidecar stopped reading the engine) and keeps the
// workload up. At the default step: a heartbeat every 60 s, stale after
// 3 min.
const (
	DemandHeartbeatSteps = 6
	DemandStaleSteps     = 18
)

// Marshal is the annotation value of r.
func (r Report) Marshal() (string, error) {
	b, err := json.Marshal(r)
	return string(b), err
}

// Parse reads an annotation value.
func Parse(s string) (Report, error) {
	var r Report
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return Report{}, fmt.Errorf("annotation %s: %w", Annotation, err)
	}
	switch r.How {
	case HowReload, HowSignal, HowStart, HowPush:
	default:
		return Report{}, fmt.Errorf("annotation %s: how %q is not %s, %s, %s or %s", Annotation, r.How, HowReload, HowSignal, HowStart, HowPush)
	}
	return r, nil
}
