package compiler

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/peers"
	"github.com/modelsphere/autoconfig/schema/routespec"
)

// canaryEndpoints are the canary's backends in the goldens (one labelled
// with another GPU, so the canary's monitor lines derive their own).
var canaryEndpoints = []Endpoint{
	{IP: "10.0.5.2", Port: 8000, Ready: true, GPUProduct: "NVIDIA-H20-3e"},
	{IP: "10.0.5.1", Port: 8000, Ready: true, GPUProduct: "NVIDIA-H20-3e"},
}

// withCanary is a copy of r with spec.canary at weight (and split keys
// when given: sticky, override, cookie).
func withCanary(r *Route, weight int32, split ...string) *Route {
	c := clone(r)
	c.Spec.Canary = &routespec.Canary{Discovery: routespec.Discovery{Service: "llm/canary"}, Weight: weight}
	if len(split) == 3 {
		c.Spec.Split = &routespec.Split{StickyHeader: split[0], OverrideHeader: split[1], StickyCookie: split[2]}
	}
	return c
}

// TestGoldenCanary pins the outputs of the sample routes with a canary
// (weight 10, default split keys; the llm sample also with its own keys),
// static and dynamic, in testdata/golden/canary/. Update with
//
//	AUTOCONFIG_UPDATE=1 go test -run TestGoldenCanary ./compiler
func TestGoldenCanary(t *testing.T) {
	root, routes, _, snap, base := goldenInputs(t)
	snap.CanaryBackends = canaryEndpoints
	snap = normalized(snap)
	for _, tc := range []struct {
		rel, name string
		split     []string
		dynamic   bool
	}{
		{"deploy/samples/modelroute-llm.yaml", "llm", nil, false},
		{"deploy/samples/modelroute-llm.yaml", "llm-split", []string{"x-conversation", "x-version", "conv"}, false},
		{"deploy/samples/modelroute-llm.yaml", "llm.dynamic", nil, true},
		{"deploy/samples/modelroute-video.yaml", "video", nil, false},
		{"deploy/samples/modelroute-video.yaml", "video.dynamic", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := withCanary(routes[tc.rel], 10, tc.split...)
			res, err := Compile(r, snap, Options{DynamicPeers: tc.dynamic})
			if err != nil {
				t.Fatal(err)
			}
			got := renderOutputs(t, "# "+tc.rel+" with spec.canary (weight 10) compiled with testdata/snapshots/default.yaml and two canary backends\n", res, base)
			for _, o := range res.Outputs {
				if strings.HasPrefix(o.Key, "peers_") {
					data, err := o.Render(base)
					if err != nil {
						t.Fatal(err)
					}
					tb, err := peers.Parse(data)
					if err != nil || tb.Format != peers.FormatCanary || tb.Canary.Weight != 10 || len(tb.Canary.Tiers[0].Peers) != 2 {
						t.Errorf("peers table: %v %+v", err, tb)
					}
				}
			}
			checkGolden(t, filepath.Join(root, "testdata", "golden", "canary", tc.name+".txt"), got, "TestGoldenCanary")
		})
	}
}

// TestCanaryAbsentByteIdentical: canary endpoints in the snapshot change
// nothing of a route without spec.canary (every output, static and
// dynamic); the goldens of testdata/golden (TestGolden, TestGoldenDynamic)
// pin the rest.
func TestCanaryAbsentByteIdentical(t *testing.T) {
	_, routes, rels, snap, base := goldenInputs(t)
	with := snap
	with.CanaryBackends = canaryEndpoints
	with = normalized(with)
	checked := 0
	for _, rel := range rels {
		if routes[rel].Spec.Canary != nil {
			continue // the corpus's canary routes: TestGolden pins them
		}
		checked++
		for _, dyn := range []bool{false, true} {
			a, err1 := Compile(routes[rel], snap, Options{DynamicPeers: dyn})
			b, err2 := Compile(routes[rel], with, Options{DynamicPeers: dyn})
			if err1 != nil || err2 != nil || len(a.Outputs) != len(b.Outputs) || b.CanaryNoBackends {
				t.Fatalf("%s: %v %v", rel, err1, err2)
			}
			for i := range a.Outputs {
				x, _ := a.Outputs[i].Render(base)
				y, _ := b.Outputs[i].Render(base)
				if !bytes.Equal(x, y) {
					t.Errorf("%s dynamic=%v: %s changed by canary endpoints of a route without spec.canary", rel, dyn, a.Outputs[i].Key)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no route without spec.canary in the corpus")
	}
}

// TestCanaryNoBackends: a canary without endpoints is no error: the route
// renders with an empty canary tier, Result.CanaryNoBackends and a
// warning naming ReasonCanaryNoBackends; a bad canary endpoint or weight
// fails the route.
func TestCanaryNoBackends(t *testing.T) {
	_, routes, _, snap, _ := goldenInputs(t)
	r := withCanary(routes["deploy/samples/modelroute-llm.yaml"], 10)
	res, err := Compile(r, snap, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.CanaryNoBackends || len(res.Warnings) == 0 || !strings.Contains(strings.Join(res.Warnings, "\n"), ReasonCanaryNoBackends) {
		t.Errorf("CanaryNoBackends %v, warnings %q", res.CanaryNoBackends, res.Warnings)
	}
	conf, _ := res.Outputs[0].Render(nil)
	if !strings.Contains(string(conf), "[ \"use\" ] = \"canary\"") {
		t.Errorf("no canary tier:\n%s", conf)
	}
	bad := snap
	bad.CanaryBackends = []Endpoint{{IP: "10.0.0.x", Port: 80}}
	if _, err := Compile(r, bad, Options{}); err == nil || !strings.Contains(err.Error(), "canary backend") {
		t.Errorf("bad canary endpoint: %v", err)
	}
	if _, err := Compile(withCanary(r, 101), snap, Options{}); err == nil {
		t.Error("weight 101 compiled")
	}
}

// TestCanaryDynamicRampIsAPush: with dynamic peers the route file of a
// canary route depends neither on the canary's endpoints nor on its
// weight (llm and video): a ramp or a canary scale-out changes only the
// peers table, which the sidecar pushes without a reload; the table's
// version changes with each.
func TestCanaryDynamicRampIsAPush(t *testing.T) {
	_, routes, _, snap, _ := goldenInputs(t)
	for _, rel := range []string{"deploy/samples/modelroute-llm.yaml", "deploy/samples/modelroute-video.yaml"} {
		var file []byte
		versions := map[string]bool{}
		for _, w := range []int32{0, 10, 25, 50, 100} {
			for _, canary := range [][]Endpoint{nil, canaryEndpoints[:1], canaryEndpoints} {
				s := snap
				s.CanaryBackends = canary
				res, err := Compile(withCanary(routes[rel], w), normalized(s), Options{DynamicPeers: true})
				if err != nil {
					t.Fatal(err)
				}
				conf, _ := res.Outputs[0].Render(nil)
				if file == nil {
					file = conf
				} else if !bytes.Equal(conf, file) {
					t.Fatalf("%s: the dynamic route file changed with weight %d and %d canary endpoints", rel, w, len(canary))
				}
				body, _ := res.Outputs[1].Render(nil)
				tb, err := peers.Parse(body)
				if err != nil || tb.Canary.Weight != w || len(tb.Canary.Tiers[0].Peers) != len(canary) {
					t.Fatalf("%s: table %v %+v", rel, err, tb)
				}
				versions[tb.Version] = true
			}
		}
		if len(versions) != 15 {
			t.Errorf("%s: %d table versions for 15 different tables", rel, len(versions))
		}
	}
}
