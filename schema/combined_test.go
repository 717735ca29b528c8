package schema_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/modelsphere/autoconfig/schema"
)

// A mutation gives a valid route exactly the problems it wants: each alone
// is found (TestMutationsAlone), and so is every combination of them that
// does not touch the same part twice (TestCombinedProblemsAllReported).
type mutation struct {
	name string
	// changes: the parts of the route it changes; needs: the parts it
	// relies on being as in the base route. Two mutations combine when
	// neither changes what the other changes or needs.
	changes, needs []string
	apply          func(doc map[string]any)
	want           []want
}

// want is a problem: its path and a prefix of its message.
type want struct{ path, message string }

func (m mutation) combines(o mutation) bool {
	for _, c := range m.changes {
		if slices.Contains(o.changes, c) || slices.Contains(o.needs, c) {
			return false
		}
	}
	for _, c := range o.changes {
		if slices.Contains(m.needs, c) {
			return false
		}
	}
	return true
}

const llmBase = `
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata:
  name: qwen
  namespace: llm-route
  labels: {app: qwen}
spec:
  modelType: llm
  failureMode: FailOpen
  discovery: {service: llm/qwen, port: 8000, includeNotReady: false}
  cart: {service: llm-route/qwen-cart, outputConfigMap: llm-route/qwen-cart-config, maxLoad: 20}
  nginx:
    route: qwen
    outputConfigMap: llm-route/openresty-conf
    service: llm-route/qwen-entry
    values: {default_max: "30", shared_dict_size: 10m}
    peers:
    - {use: cart, priority: 3, maxConcurrencyFromBackend: true, probePath: /health}
    - {use: backend, priority: 2, maxConcurrency: 100}
    - {use: backend-svc, priority: 1}
  monitor: {outputConfigMap: monitoring/monitor-conf, model: Qwen/Qwen2, gpuType: H100, nginx: true}
  slo: {ttftMs: 1500}
  canary: {discovery: {service: llm/qwen-v2}, weight: 10}
  split: {stickyHeader: x-session, overrideHeader: x-version}
`

const videoBase = `
apiVersion: routing.modelsphere.dev/v1alpha1
kind: ModelRoute
metadata:
  name: wan
  namespace: video
spec:
  modelType: video
  discovery: {service: video/wan}
  nginx:
    outputConfigMap: video/openresty-conf
    values: {max_body_size: 64m, rate_limit: 200Mbps, upload_req_limit: 10r/s, upload_req_burst: "5"}
    peers: [{use: backend}, {use: backend-svc}]
  canary: {discovery: {selector: app=wan-v2, port: 8000}, weight: 50}
  split: {stickyCookie: wan}
`

// common are mutations of parts every route has.
var common = []mutation{
	{name: "bad name", changes: []string{"name"}, apply: set("metadata.name", "Qwen_72B"),
		want: []want{{"metadata.name", "metadata.name must be a lowercase DNS name"}}},
	{name: "missing name", changes: []string{"name"}, needs: []string{"nginx.ocm"}, apply: del("metadata.name"),
		want: []want{{"metadata.name", "this field is required"}}},
	{name: "bad namespace", changes: []string{"namespace"}, apply: set("metadata.namespace", "LLM"),
		want: []want{{"metadata.namespace", "metadata.namespace must be a lowercase DNS label"}}},
	{name: "unknown top field", changes: []string{"top.extra"}, apply: set("extra", 1),
		want: []want{{"extra", "unknown field"}}},
	{name: "unknown metadata field", changes: []string{"metadata.owner"}, apply: set("metadata.owner", "me"),
		want: []want{{"metadata.owner", "unknown field"}}},
	{name: "annotations not a mapping", changes: []string{"annotations"}, apply: set("metadata.annotations", "x"),
		want: []want{{"metadata.annotations", "must be a mapping of fields, not a string"}}},
	{name: "wrong kind", changes: []string{"kind"}, apply: set("kind", "ModelRoutes"),
		want: []want{{"kind", "kind must be ModelRoute"}}},
	{name: "wrong apiVersion", changes: []string{"apiVersion"}, apply: set("apiVersion", "routing.modelsphere.dev/v1"),
		want: []want{{"apiVersion", "apiVersion must be routing.modelsphere.dev/v1alpha1"}}},
	{name: "unknown spec field", changes: []string{"spec.extra"}, apply: set("spec.replicas", 3),
		want: []want{{"spec.replicas", "unknown field"}}},
	{name: "port zero", changes: []string{"discovery.port"}, apply: set("spec.discovery.port", 0),
		want: []want{{"spec.discovery.port", "port must be a whole number from 1 to 65535"}}},
	{name: "includeNotReady string", changes: []string{"discovery.inr"}, apply: set("spec.discovery.includeNotReady", "yes"),
		want: []want{{"spec.discovery.includeNotReady", "includeNotReady must be true or false"}}},
	{name: "discovery service and selector", changes: []string{"discovery.sel"}, apply: set("spec.discovery.selector", "app=qwen"),
		want: []want{{"spec.discovery", "set only one of service or selector"}}},
	{name: "discovery neither", changes: []string{"discovery.sel"}, apply: del("spec.discovery.service"),
		want: []want{{"spec.discovery", "set exactly one of service"}}},
	{name: "unknown discovery field", changes: []string{"discovery.extra"}, apply: set("spec.discovery.namespace", "x"),
		want: []want{{"spec.discovery.namespace", "unknown field"}}},
	{name: "bad nginx outputConfigMap", changes: []string{"nginx.ocm"}, apply: set("spec.nginx.outputConfigMap", "Bad CM"),
		want: []want{{"spec.nginx.outputConfigMap", "must be a ConfigMap name or namespace/name"}}},
	{name: "missing nginx outputConfigMap", changes: []string{"nginx.ocm"}, needs: []string{"name"}, apply: del("spec.nginx.outputConfigMap"),
		want: []want{{"spec.nginx.outputConfigMap", "this field is required"}}},
	{name: "bad entry service", changes: []string{"nginx.service"}, apply: set("spec.nginx.service", "Bad_Svc"),
		want: []want{{"spec.nginx.service", "must be a Service name or namespace/name"}}},
	{name: "unknown nginx field", changes: []string{"nginx.extra"}, apply: set("spec.nginx.peer", []any{}),
		want: []want{{"spec.nginx.peer", "unknown field"}}},
	{name: "value key of a wrong form", changes: []string{"values.bad"}, apply: set("spec.nginx.values.bad key", "x"),
		want: []want{{"spec.nginx.values.bad key", "bad key is not an option name"}}},
	{name: "route with capitals", changes: []string{"route"}, apply: set("spec.nginx.route", "Upper"),
		want: []want{{"spec.nginx.route", "route must use only a-z, 0-9"}}},
	{name: "route too long", changes: []string{"route"}, apply: set("spec.nginx.route", strings.Repeat("r", 64)),
		want: []want{{"spec.nginx.route", "route is longer than 63 characters"}}},
	{name: "route dot", changes: []string{"route"}, apply: set("spec.nginx.route", "."),
		want: []want{{"spec.nginx.route", "route cannot be '.' or '..'"}}},
	{name: "peer priority negative", changes: []string{"peers.0.priority"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.0.priority", -1),
		want: []want{{"spec.nginx.peers.0.priority", "priority must be a whole number from 0 to 1000"}}},
	{name: "peer probePath relative", changes: []string{"peers.0.probe"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.0.probePath", "health"),
		want: []want{{"spec.nginx.peers.0.probePath", "probePath must be an absolute path"}}},
	{name: "unknown peer field", changes: []string{"peers.1.extra"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.1.weight", 3),
		want: []want{{"spec.nginx.peers.1.weight", "unknown field"}}},
	{name: "peers empty", changes: []string{"peers"}, needs: []string{"name", "nginx.ocm"}, apply: set("spec.nginx.peers", []any{}),
		want: []want{{"spec.nginx.peers", "peers needs at least one peer"}}},
}

// canary are mutations of the canary and split every base route has.
var canary = []mutation{
	{name: "canary weight too big", changes: []string{"canary.weight"}, needs: []string{"canary"}, apply: set("spec.canary.weight", 101),
		want: []want{{"spec.canary.weight", "canary.weight must be a whole number from 0 to 100"}}},
	{name: "canary weight missing", changes: []string{"canary.weight"}, needs: []string{"canary"}, apply: del("spec.canary.weight"),
		want: []want{{"spec.canary.weight", "canary.weight is required"}}},
	{name: "canary port zero", changes: []string{"canary.port"}, needs: []string{"canary"}, apply: set("spec.canary.discovery.port", 0),
		want: []want{{"spec.canary.discovery.port", "port must be a whole number from 1 to 65535"}}},
	{name: "unknown canary field", changes: []string{"canary.extra"}, needs: []string{"canary"}, apply: set("spec.canary.replicas", 2),
		want: []want{{"spec.canary.replicas", "unknown field"}}},
	{name: "split without canary", changes: []string{"canary"}, needs: []string{"split"}, apply: del("spec.canary"),
		want: []want{{"spec.split", "split only applies to a canary route"}}},
	{name: "split headers the same", changes: []string{"split.headers"}, needs: []string{"split"}, apply: func(doc map[string]any) {
		set("spec.split.stickyHeader", "x-same")(doc)
		set("spec.split.overrideHeader", "x-same")(doc)
	}, want: []want{{"spec.split.overrideHeader", "overrideHeader is the same header as stickyHeader"}}},
	{name: "split header upper case", changes: []string{"split.headers"}, needs: []string{"split"}, apply: set("spec.split.stickyHeader", "X-Session"),
		want: []want{{"spec.split.stickyHeader", "split.stickyHeader must be an HTTP header name in lower case"}}},
	{name: "split cookie bad", changes: []string{"split.cookie"}, needs: []string{"split"}, apply: set("spec.split.stickyCookie", "a;b"),
		want: []want{{"spec.split.stickyCookie", "split.stickyCookie must be a cookie name"}}},
	{name: "unknown split field", changes: []string{"split.extra"}, needs: []string{"split"}, apply: set("spec.split.weight", 5),
		want: []want{{"spec.split.weight", "unknown field"}}},
}

// llm are mutations of the LLM route.
var llm = []mutation{
	{name: "canary service and selector", changes: []string{"canary.disc"}, needs: []string{"canary"}, apply: set("spec.canary.discovery.selector", "app=qwen-v2"),
		want: []want{{"spec.canary.discovery", "set only one of service or selector"}}},
	{name: "canary on the stable Service", changes: []string{"canary.disc"}, needs: []string{"canary", "discovery.sel"}, apply: set("spec.canary.discovery.service", "llm/qwen"),
		want: []want{{"spec.canary.discovery.service", "canary.discovery.service is the Service of spec.discovery"}}},
	{name: "bad model type", changes: []string{"modelType"}, apply: set("spec.modelType", "chat"),
		want: []want{{"spec.modelType", "modelType must be llm or video"}}},
	{name: "bad failureMode", changes: []string{"failureMode"}, apply: set("spec.failureMode", "open"),
		want: []want{{"spec.failureMode", "failureMode must be FailOpen or FailClose"}}},
	{name: "cart without outputConfigMap", changes: []string{"cart.ocm"}, needs: []string{"cart"}, apply: del("spec.cart.outputConfigMap"),
		want: []want{{"spec.cart.outputConfigMap", "this field is required"}}},
	{name: "cart maxLoad zero", changes: []string{"cart.maxLoad"}, needs: []string{"cart"}, apply: set("spec.cart.maxLoad", 0),
		want: []want{{"spec.cart.maxLoad", "maxLoad must be a whole number"}}},
	{name: "cart neither", changes: []string{"cart.sel"}, needs: []string{"cart", "name", "nginx.ocm"}, apply: del("spec.cart.service"),
		want: []want{{"spec.cart", "set exactly one of service"}}},
	{name: "unknown cart field", changes: []string{"cart.extra"}, needs: []string{"cart"}, apply: set("spec.cart.workers", 2),
		want: []want{{"spec.cart.workers", "unknown field"}}},
	{name: "cart peer without cart", changes: []string{"cart"}, needs: []string{"modelType", "peers"}, apply: del("spec.cart"),
		want: []want{{"spec.nginx.peers.0.use", "a peer with use: cart requires spec.cart"}}},
	{name: "value a number", changes: []string{"values.timeout"}, apply: set("spec.nginx.values.timeout", 30),
		want: []want{{"spec.nginx.values.timeout", "each value must be a string"}}},
	{name: "shared_dict_size with g", changes: []string{"values.dict"}, needs: []string{"modelType"}, apply: set("spec.nginx.values.shared_dict_size", "1g"),
		want: []want{{"spec.nginx.values.shared_dict_size", "shared_dict_size must be an nginx size"}}},
	{name: "slo and value set one option", changes: []string{"values.ttft"}, needs: []string{"modelType"}, apply: set("spec.nginx.values.ttft_limit_ms", "100"),
		want: []want{{"spec.slo.ttftMs", "spec.slo.ttftMs and spec.nginx.values.ttft_limit_ms both set"}}},
	{name: "slo ttftMs zero", changes: []string{"slo.ttft"}, apply: set("spec.slo.ttftMs", 0),
		want: []want{{"spec.slo.ttftMs", "ttftMs must be a whole number of milliseconds"}}},
	{name: "unknown slo field", changes: []string{"slo.extra"}, apply: set("spec.slo.ttft", 1),
		want: []want{{"spec.slo.ttft", "unknown field"}}},
	{name: "too many values", changes: []string{"values.many"}, apply: func(doc map[string]any) {
		for i := range 70 {
			set(fmt.Sprintf("spec.nginx.values.k%02d", i), "v")(doc)
		}
	}, want: []want{{"spec.nginx.values", "values has more than 64 keys"}}},
	{name: "monitor into the nginx ConfigMap", changes: []string{"monitor.ocm"}, needs: []string{"nginx.ocm"}, apply: set("spec.monitor.outputConfigMap", "llm-route/openresty-conf"),
		want: []want{{"spec.monitor.outputConfigMap", "monitor.outputConfigMap is the nginx outputConfigMap"}}},
	{name: "monitor without outputConfigMap", changes: []string{"monitor.ocm"}, apply: del("spec.monitor.outputConfigMap"),
		want: []want{{"spec.monitor.outputConfigMap", "this field is required"}}},
	{name: "bad gpuType", changes: []string{"monitor.gpu"}, apply: set("spec.monitor.gpuType", "H 100"),
		want: []want{{"spec.monitor.gpuType", "gpuType must be a short name"}}},
	{name: "monitor nginx string", changes: []string{"monitor.nginx"}, apply: set("spec.monitor.nginx", "yes"),
		want: []want{{"spec.monitor.nginx", "monitor.nginx must be true or false"}}},
	{name: "monitor model too long", changes: []string{"monitor.model"}, apply: set("spec.monitor.model", strings.Repeat("m", 201)),
		want: []want{{"spec.monitor.model", "monitor.model must be a served model name"}}},
	{name: "unknown monitor field", changes: []string{"monitor.extra"}, apply: set("spec.monitor.nginxx", true),
		want: []want{{"spec.monitor.nginxx", "unknown field"}}},
	{name: "backend limit zero", changes: []string{"peers.1.maxConcurrency", "mcfb"}, needs: []string{"peers", "modelType"}, apply: set("spec.nginx.peers.1.maxConcurrency", 0),
		want: []want{{"spec.nginx.peers.1.maxConcurrency", "maxConcurrency must be a whole number"}, {"spec.nginx.peers.0.maxConcurrencyFromBackend", "maxConcurrencyFromBackend: true needs a use: backend peer"}}},
	{name: "maxConcurrencyFromBackend on backend", changes: []string{"mcfb"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.1.maxConcurrencyFromBackend", true),
		want: []want{{"spec.nginx.peers.1.maxConcurrencyFromBackend", "maxConcurrencyFromBackend is only for use: cart peers"}}},
	{name: "peer without use", changes: []string{"peers.2.use"}, needs: []string{"peers"}, apply: del("spec.nginx.peers.2.use"),
		want: []want{{"spec.nginx.peers.2.use", "every peer needs use"}}},
	{name: "peer use unknown", changes: []string{"peers.2.use"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.2.use", "svc"),
		want: []want{{"spec.nginx.peers.2.use", "use must be cart, backend or backend-svc"}}},
	{name: "use twice", changes: []string{"peers.append"}, needs: []string{"peers"}, apply: appendPeer(map[string]any{"use": "backend"}),
		want: []want{{"spec.nginx.peers.3.use", "each use may appear once; backend is listed twice"}}},
}

// video are mutations of the video route.
var video = []mutation{
	{name: "canary neither service nor selector", changes: []string{"canary.disc"}, needs: []string{"canary"}, apply: del("spec.canary.discovery.selector"),
		want: []want{{"spec.canary.discovery", "set exactly one of service"}}},
	{name: "canary selector bad", changes: []string{"canary.disc"}, needs: []string{"canary"}, apply: set("spec.canary.discovery.selector", "app=wan,"),
		want: []want{{"spec.canary.discovery.selector", "must be a label selector"}}},
	{name: "video with cart", changes: []string{"cart"}, apply: set("spec.cart", map[string]any{"service": "video/wan-cart", "outputConfigMap": "video/wan-cart"}),
		want: []want{{"spec.cart", "video routes cannot use cart"}}},
	{name: "video with slo", changes: []string{"slo"}, apply: set("spec.slo", map[string]any{"ttftMs": 100}),
		want: []want{{"spec.slo", "video routes cannot use slo"}}},
	{name: "video with monitor", changes: []string{"monitor"}, apply: set("spec.monitor", map[string]any{"outputConfigMap": "monitoring/monitor-conf"}),
		want: []want{{"spec.monitor", "video routes cannot use monitor"}}},
	{name: "video cart peer", changes: []string{"peers.0.use"}, needs: []string{"peers"}, apply: set("spec.nginx.peers.0.use", "cart"),
		want: []want{{"spec.nginx.peers.0.use", "video routes render a plain reverse proxy"}}},
	{name: "video LLM value", changes: []string{"values.default_max"}, apply: set("spec.nginx.values.default_max", "5"),
		want: []want{{"spec.nginx.values.default_max", "default_max is not a video option"}}},
	{name: "video burst without limit", changes: []string{"values.limit"}, apply: del("spec.nginx.values.upload_req_limit"),
		want: []want{{"spec.nginx.values.upload_req_burst", "upload_req_burst needs upload_req_limit"}}},
	{name: "video body size", changes: []string{"values.body"}, apply: set("spec.nginx.values.max_body_size", "64 m"),
		want: []want{{"spec.nginx.values.max_body_size", "max_body_size must be an nginx size"}}},
	{name: "video rate limit", changes: []string{"values.rate"}, apply: set("spec.nginx.values.rate_limit", "fast"),
		want: []want{{"spec.nginx.values.rate_limit", "rate_limit must be bits per second"}}},
	{name: "video timeout a number", changes: []string{"values.timeout"}, apply: set("spec.nginx.values.proxy_timeout", 30),
		want: []want{{"spec.nginx.values.proxy_timeout", "proxy_timeout must be an nginx time"}}},
	{name: "video api_keys too long", changes: []string{"values.keys"}, apply: set("spec.nginx.values.api_keys", strings.Repeat("k", 4097)),
		want: []want{{"spec.nginx.values.api_keys", "each value must be a string"}}},
}

func TestMutationsAlone(t *testing.T) {
	v := mustValidator(t)
	for _, c := range []struct {
		base string
		muts []mutation
	}{{llmBase, slices.Concat(common, canary, llm)}, {videoBase, slices.Concat(common, canary, video)}} {
		if _, err := v.Validate("base.yaml", []byte(c.base)); err != nil {
			t.Fatalf("base route rejected: %v", err)
		}
		for _, m := range c.muts {
			t.Run(m.name, func(t *testing.T) {
				checkCombination(t, v, c.base, []mutation{m})
			})
		}
	}
}

// TestCombinedProblemsAllReported: k problems that are each found alone
// (TestMutationsAlone) are all found, at their lines, in one document that
// has them all, for random combinations of 2 to all of them.
func TestCombinedProblemsAllReported(t *testing.T) {
	v := mustValidator(t)
	rounds := 300
	if testing.Short() {
		rounds = 40
	}
	r := rand.New(rand.NewPCG(28, 1))
	for _, c := range []struct {
		name, base string
		muts       []mutation
	}{{"llm", llmBase, slices.Concat(common, canary, llm)}, {"video", videoBase, slices.Concat(common, canary, video)}} {
		t.Run(c.name, func(t *testing.T) {
			for round := range rounds {
				k := 2 + r.IntN(len(c.muts)-1)
				var picked []mutation
				for _, i := range r.Perm(len(c.muts)) {
					m := c.muts[i]
					if len(picked) < k && !slices.ContainsFunc(picked, func(p mutation) bool { return !p.combines(m) }) {
						picked = append(picked, m)
					}
				}
				if !checkCombination(t, v, c.base, picked) {
					t.Fatalf("round %d", round)
				}
			}
		})
	}
}

// checkCombination applies muts to base and checks that validation reports
// exactly their problems, each on the line of its field (or of the nearest
// enclosing field the document has).
func checkCombination(t *testing.T, v *schema.Validator, base string, muts []mutation) bool {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(base), &doc); err != nil {
		t.Fatal(err)
	}
	var wants []want
	var names []string
	for _, m := range muts {
		m.apply(doc)
		wants = append(wants, m.want...)
		names = append(names, m.name)
	}
	src, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		t.Fatal(err)
	}
	_, err = v.Validate("route.yaml", src)
	var inv *schema.InvalidError
	if !errors.As(err, &inv) {
		t.Errorf("%s: want %d problems, got %v\n%s", strings.Join(names, " + "), len(wants), err, src)
		return false
	}
	ok := true
	left := slices.Clone(inv.Problems)
	for _, w := range wants {
		i := slices.IndexFunc(left, func(p schema.Problem) bool { return p.Path == w.path && strings.HasPrefix(p.Message, w.message) })
		if i < 0 {
			t.Errorf("%s: not reported: %s: %s", strings.Join(names, " + "), w.path, w.message)
			ok = false
			continue
		}
		if line := lineOf(root.Content[0], strings.Split(w.path, ".")); left[i].Line != line {
			t.Errorf("%s: %s reported at line %d, want %d", strings.Join(names, " + "), w.path, left[i].Line, line)
			ok = false
		}
		left = slices.Delete(left, i, i+1)
	}
	for _, p := range left {
		t.Errorf("%s: reported but not expected: %s", strings.Join(names, " + "), p)
		ok = false
	}
	if !ok {
		t.Logf("route:\n%s", src)
	}
	return ok
}

// lineOf is the line of the field at path, or of its nearest enclosing
// field in the document (1: the document's start).
func lineOf(n *yaml.Node, path []string) int {
	line := 1
	for _, c := range path {
		switch n.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == c {
					line, next = n.Content[i].Line, n.Content[i+1]
					break
				}
			}
			if next == nil {
				return line
			}
			n = next
		case yaml.SequenceNode:
			i, err := strconv.Atoi(c)
			if err != nil || i >= len(n.Content) {
				return line
			}
			n = n.Content[i]
			line = n.Line
		default:
			return line
		}
	}
	return line
}

// set sets the value at a dotted path (list elements by index), creating
// the maps on the way.
func set(path string, value any) func(map[string]any) {
	return func(doc map[string]any) {
		parts := strings.Split(path, ".")
		var cur any = doc
		for _, p := range parts[:len(parts)-1] {
			cur = child(cur, p, true)
		}
		switch c := cur.(type) {
		case map[string]any:
			c[parts[len(parts)-1]] = value
		case []any:
			i, _ := strconv.Atoi(parts[len(parts)-1])
			c[i] = value
		}
	}
}

// del removes the field at a dotted path.
func del(path string) func(map[string]any) {
	return func(doc map[string]any) {
		parts := strings.Split(path, ".")
		var cur any = doc
		for _, p := range parts[:len(parts)-1] {
			cur = child(cur, p, false)
		}
		if m, ok := cur.(map[string]any); ok {
			delete(m, parts[len(parts)-1])
		}
	}
}

// appendPeer adds a peer after the route's peers.
func appendPeer(p map[string]any) func(map[string]any) {
	return func(doc map[string]any) {
		nginx := child(child(doc, "spec", false), "nginx", false).(map[string]any)
		nginx["peers"] = append(nginx["peers"].([]any), p)
	}
}

func child(cur any, p string, create bool) any {
	switch c := cur.(type) {
	case map[string]any:
		if _, ok := c[p]; !ok && create {
			c[p] = map[string]any{}
		}
		return c[p]
	case []any:
		i, _ := strconv.Atoi(p)
		return c[i]
	}
	return nil
}
