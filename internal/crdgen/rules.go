package crdgen

import (
	"fmt"
	"sort"
	"strings"

	"cuelang.org/go/cue"

	"github.com/modelsphere/autoconfig/schema/routespec"
	"github.com/modelsphere/autoconfig/schema/v1alpha1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// isVideo is true for a video route; modelType defaults to llm and the CRD
// carries no defaults, so an absent modelType is llm.
const isVideo = `(has(self.modelType) && self.modelType == "video")`

// The regexes of the CUE rules that live in comprehensions (the walker
// reads field constraints, not comprehension conditions). TestRulesFollowCUE
// checks that each still appears verbatim in the schema source.
const (
	routeRE = `^[a-z0-9._-]+$`
	modelRE = `^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$`
	dictRE  = `^((6553[6-9]|655[4-9][0-9]|65[6-9][0-9]{2}|6[6-9][0-9]{3}|[7-9][0-9]{4}|[1-9][0-9]{5,9}|1[0-6][0-9]{9}|170[0-9]{8}|171[0-6][0-9]{7}|1717[0-8][0-9]{6}|17179[0-7][0-9]{5}|171798[0-5][0-9]{4}|1717986[0-8][0-9]{3}|171798690[0-9]{2}|171798691[0-7][0-9]|1717986918[0-4])|(6[4-9]|[7-9][0-9]|[1-9][0-9]{2,6}|1[0-5][0-9]{6}|16[0-6][0-9]{5}|167[0-6][0-9]{4}|1677[0-6][0-9]{3}|16777[01][0-9]{2}|1677720[0-9]|1677721[0-6])[kK]|([1-9][0-9]{0,3}|1[0-5][0-9]{3}|16[0-2][0-9]{2}|163[0-7][0-9]|1638[0-4])[mM])$`
)

// Messages of the CUE rules that live in comprehensions, copied verbatim;
// TestRulesFollowCUE fails when the schema's wording changes.
const (
	msgRouteCharset   = "route must use only a-z, 0-9, '.', '_' and '-' (it defaults to metadata.name and names the socket, the conf file and the /<route>/ path); set spec.nginx.route to such a name"
	msgRouteLength    = "route is longer than 63 characters (it defaults to metadata.name); set a shorter spec.nginx.route"
	msgRouteDots      = "route cannot be '.' or '..': nginx resolves them out of the /<route>/ path, so no request would reach the route; set another spec.nginx.route"
	msgNoPeers        = "peers needs at least one peer, e.g. - {use: backend, priority: 2}"
	msgModel          = "model must be a served model name: letters, digits, '.', '_', '-', '/' (at most 200; it defaults to metadata.name)"
	msgBoth           = "set only one of service or selector: service (EndpointSlice discovery, recommended) or selector (pods by label)"
	msgNeither        = "set exactly one of service (a Service name or ns/name) or selector (a pod label selector such as app=qwen)"
	msgVideoCart      = "video routes cannot use cart (LLM only); remove spec.cart or set modelType: llm"
	msgVideoSLO       = "video routes cannot use slo (token metrics do not exist for video); remove spec.slo or set modelType: llm"
	msgVideoMonitor   = "video routes cannot use monitor (its probes and alerts are for LLM endpoints; scrape the video service's own metrics); remove spec.monitor or set modelType: llm"
	msgVideoPeerUse   = "video routes render a plain reverse proxy: use backend or backend-svc (cart is LLM only)"
	msgCartPeer       = "a peer with use: cart requires spec.cart; add spec.cart or remove this peer"
	msgFromBackend    = "maxConcurrencyFromBackend: true needs a use: backend peer with maxConcurrency > 0 (the per-backend limit it multiplies); add maxConcurrency to the backend peer"
	msgFromBackendUse = "maxConcurrencyFromBackend is only for use: cart peers; remove it"
	msgSLOTTFT        = "spec.slo.ttftMs and spec.nginx.values.ttft_limit_ms both set the engine option ttft_limit_ms; keep one: remove the value (spec.slo.ttftMs renders it) or remove spec.slo.ttftMs"
	msgSLOTPS         = "spec.slo.decodeTokensPerSecond and spec.nginx.values.tps_limit_tps both set the engine option tps_limit_tps; keep one: remove the value (spec.slo.decodeTokensPerSecond renders it) or remove spec.slo.decodeTokensPerSecond"
	msgHoldValue      = "hold_timeout is rendered from spec.scaleToZero.holdTimeout (the engine holds requests only while the controller can wake the model); remove the value and set spec.scaleToZero"
	msgScaleConsumers = "scaleToZero needs spec.nginx.service or spec.nginx.selector (the openresty pods): the controller wakes the model when their engines hold requests, and reads that from those pods; set one of them"
	msgBurst          = "upload_req_burst needs upload_req_limit; add upload_req_limit (e.g. 10r/s) or remove the burst"
	msgUseTwice       = "each use may appear once; "
	msgMonitorInNginx = "monitor.outputConfigMap is the nginx outputConfigMap: openresty includes every *.conf key there, so the monitor file would be loaded as nginx configuration; write the monitor lines to the monitoring agent's own ConfigMap"
	msgValuesBytes    = "values add up to more than 16384 bytes (keys and values; the route file shares a 1 MiB ConfigMap with other routes); shorten them"
	msgValuesCount    = "values has more than 64 keys (the route file shares a 1 MiB ConfigMap with other routes); remove some"
	msgVideoKey       = " is not a video option; video routes accept max_body_size, proxy_timeout, connect_timeout, rate_limit, rate_limit_after, upload_conn_limit, upload_req_limit, upload_req_burst, api_keys, auth_public_paths, upload_limit_key; remove it or set modelType: llm"
	msgSplitNoCanary  = "split only applies to a canary route: add spec.canary (the canary version's discovery and weight) or remove spec.split"
	msgSameHeader     = "overrideHeader is the same header as stickyHeader: one header cannot carry both the session key and the version: give them different names (defaults x-session-id and x-model-version)"
	msgSameService    = "canary.discovery.service is the Service of spec.discovery: both versions would be the same backends; point canary.discovery at the canary version's own Service (or, when the same pods serve both versions, give both discoveries their different ports)"
	msgSameSelector   = "canary.discovery.selector is the selector of spec.discovery: both versions would be the same backends; select the canary version's own pods (or, when the same pods serve both versions, give both discoveries their different ports)"
	msgDictSize       = "shared_dict_size must be an nginx size such as 10m, 512k or 1024m (from 64k to 16384m, no g unit: nginx's lua_shared_dict refuses it; it sizes the route's lua shared dict)"
)

// copiedMessages lists the hand-copied messages for TestRulesFollowCUE.
var copiedMessages = []string{
	msgRouteCharset, msgRouteLength, msgRouteDots, msgNoPeers, msgModel, msgBoth, msgNeither,
	msgVideoCart, msgVideoSLO, msgVideoMonitor, msgVideoPeerUse, msgCartPeer,
	msgFromBackend, msgFromBackendUse, msgSLOTTFT, msgSLOTPS, msgHoldValue, msgScaleConsumers, msgBurst, msgUseTwice, msgDictSize, msgValuesCount, msgMonitorInNginx, msgValuesBytes,
	msgVideoKey, msgSplitNoCanary, msgSameHeader, msgSameService, msgSameSelector,
}

// copiedRegexes lists the hand-copied regexes for TestRulesFollowCUE.
var copiedRegexes = []string{routeRE, modelRE, dictRE}

// portsDiffer (on spec, with a canary): both discoveries give a port, and
// they differ.
const portsDiffer = `(has(self.canary.discovery.port) && has(self.discovery.port) && self.canary.discovery.port != self.discovery.port)`

func rule(r, msg, fieldPath string) apiextv1.ValidationRule {
	return apiextv1.ValidationRule{Rule: r, Message: msg, FieldPath: fieldPath}
}

// crossFieldRules are the CUE rules that span fields, as CEL, keyed by the
// schema path they sit on ("" = the resource root, the only place that can
// see metadata.name).
func crossFieldRules() map[string][]apiextv1.ValidationRule {
	exactlyOne := []apiextv1.ValidationRule{
		rule(`!(has(self.service) && has(self.selector))`, msgBoth, ""),
		rule(`has(self.service) || has(self.selector)`, msgNeither, ""),
	}
	hasNginx := `has(self.spec) && has(self.spec.nginx)`
	return map[string][]apiextv1.ValidationRule{
		"": {
			// nginx.route defaults to metadata.name: the route rules apply
			// to the name then. A DNS name always passes the charset, but
			// may be longer than 63.
			rule(fmt.Sprintf(`!(%s) || has(self.spec.nginx.route) || !has(self.metadata.name) || self.metadata.name.matches(%s)`, hasNginx, celString(routeRE)), msgRouteCharset, ".spec.nginx"),
			rule(fmt.Sprintf(`!(%s) || has(self.spec.nginx.route) || !has(self.metadata.name) || self.metadata.name.size() <= 63`, hasNginx), msgRouteLength, ".spec.nginx"),
			// monitor.model defaults to metadata.name.
			rule(fmt.Sprintf(`!has(self.spec) || !has(self.spec.monitor) || has(self.spec.monitor.model) || !has(self.metadata.name) || self.metadata.name.matches(%s)`, celString(modelRE)), msgModel, ".spec.monitor"),
		},
		"spec": {
			rule(`!`+isVideo+` || !has(self.cart)`, msgVideoCart, ".cart"),
			rule(`!`+isVideo+` || !has(self.slo)`, msgVideoSLO, ".slo"),
			rule(`!`+isVideo+` || !has(self.monitor)`, msgVideoMonitor, ".monitor"),
			rule(`!has(self.monitor) || self.monitor.outputConfigMap != self.nginx.outputConfigMap`, msgMonitorInNginx, ".monitor"),
			rule(`!`+isVideo+` || self.nginx.peers.all(p, p.use != "cart")`, msgVideoPeerUse, ".nginx.peers"),
			rule(`!`+isVideo+` || !has(self.nginx.values) || !("upload_req_burst" in self.nginx.values) || "upload_req_limit" in self.nginx.values`, msgBurst, ".nginx.values"),
			rule(isVideo+` || has(self.cart) || self.nginx.peers.all(p, p.use != "cart")`, msgCartPeer, ".nginx.peers"),
			rule(isVideo+` || !self.nginx.peers.exists(p, has(p.maxConcurrencyFromBackend) && p.maxConcurrencyFromBackend) || self.nginx.peers.exists(p, p.use == "backend" && has(p.maxConcurrency))`, msgFromBackend, ".nginx.peers"),
			rule(isVideo+` || !has(self.nginx.values) || !("shared_dict_size" in self.nginx.values) || self.nginx.values["shared_dict_size"].matches(`+celString(dictRE)+`)`, msgDictSize, ".nginx.values"),
			rule(isVideo+` || !has(self.slo) || !has(self.slo.ttftMs) || !has(self.nginx.values) || !("ttft_limit_ms" in self.nginx.values)`, msgSLOTTFT, ".slo.ttftMs"),
			rule(isVideo+` || !has(self.slo) || !has(self.slo.decodeTokensPerSecond) || !has(self.nginx.values) || !("tps_limit_tps" in self.nginx.values)`, msgSLOTPS, ".slo.decodeTokensPerSecond"),
			rule(isVideo+` || !has(self.nginx.values) || !("hold_timeout" in self.nginx.values)`, msgHoldValue, ".nginx.values"),
			rule(`!has(self.scaleToZero) || has(self.nginx.service) || has(self.nginx.selector)`, msgScaleConsumers, ".scaleToZero"),
			rule(`!has(self.split) || has(self.canary)`, msgSplitNoCanary, ".split"),
			// The canary's backends are not the stable version's: not the
			// same Service or selector text, unless both ports are given
			// and differ.
			rule(`!has(self.canary) || !has(self.canary.discovery) || !has(self.canary.discovery.service) || !has(self.discovery.service) || self.canary.discovery.service != self.discovery.service || `+portsDiffer, msgSameService, ".canary.discovery.service"),
			rule(`!has(self.canary) || !has(self.canary.discovery) || !has(self.canary.discovery.selector) || !has(self.discovery.selector) || self.canary.discovery.selector != self.discovery.selector || `+portsDiffer, msgSameSelector, ".canary.discovery.selector"),
		},
		"spec.discovery":        exactlyOne,
		"spec.cart":             exactlyOne,
		"spec.canary.discovery": exactlyOne,
		// split sits on spec, and its defaults apply only with a canary;
		// the API server fills them only when split is there, this judge
		// not at all, so the rule reads an absent field as its default.
		"spec.split": {
			rule(fmt.Sprintf(`(has(self.stickyHeader) ? self.stickyHeader : %s) != (has(self.overrideHeader) ? self.overrideHeader : %s)`,
				celString(routespec.DefaultStickyHeader), celString(routespec.DefaultOverrideHeader)), msgSameHeader, ".overrideHeader"),
		},
		"spec.nginx": {
			rule(`!has(self.route) || self.route.matches(`+celString(routeRE)+`)`, msgRouteCharset, ".route"),
			rule(`!has(self.route) || self.route.size() <= 63`, msgRouteLength, ".route"),
			rule(`!has(self.route) || (self.route != "." && self.route != "..")`, msgRouteDots, ".route"),
		},
		// One rule per use value, not a nested loop with a computed
		// message: the CEL cost estimator rejects the latter.
		"spec.nginx.peers": append([]apiextv1.ValidationRule{rule(`self.size() >= 1`, msgNoPeers, "")}, useOnce()...),
		"spec.nginx.peers[]": {
			rule(`self.use == "cart" || !has(self.maxConcurrencyFromBackend) || !self.maxConcurrencyFromBackend`, msgFromBackendUse, ".maxConcurrencyFromBackend"),
		},
		"spec.nginx.values": {
			rule(`self.size() <= 64`, msgValuesCount, ""),
			rule(`self.map(k, size(k) + size(bytes(self[k]))).sum() <= 16384`, msgValuesBytes, ""),
		},
		"spec.monitor": {
			rule(`!has(self.model) || self.model.matches(`+celString(modelRE)+`)`, msgModel, ".model"),
		},
	}
}

// useOnce: each use may appear once.
func useOnce() []apiextv1.ValidationRule {
	var out []apiextv1.ValidationRule
	for _, u := range []string{v1alpha1.UseCart, v1alpha1.UseBackend, v1alpha1.UseBackendSvc} {
		out = append(out, rule(fmt.Sprintf(`self.filter(p, p.use == %s).size() <= 1`, celString(u)), msgUseTwice+u+" is listed twice", ""))
	}
	return out
}

// videoRules walks #VideoValues: every field's format becomes a rule on
// spec (it depends on modelType), and its fields the list of accepted keys
// (#ModelRoute reports any other key, with msgVideoKey).
func (w *walker) videoRules() ([]apiextv1.ValidationRule, error) {
	vv := w.root.LookupPath(cue.ParsePath("#VideoValues"))
	if err := vv.Err(); err != nil {
		return nil, fmt.Errorf("#VideoValues: %w", err)
	}
	var out []apiextv1.ValidationRule
	it, err := vv.Fields(cue.Optional(true))
	if err != nil {
		return nil, fmt.Errorf("#VideoValues: %w", err)
	}
	var keys []string
	for it.Next() {
		sel := it.Selector()
		if sel.LabelType() != cue.StringLabel {
			continue
		}
		key := sel.Unquoted()
		keys = append(keys, key)
		var s scalar
		if err := w.collect(it.Value(), &s, 0); err != nil {
			return nil, fmt.Errorf("#VideoValues.%s: %w", key, err)
		}
		if len(s.patterns) != 1 || len(s.messages) != 1 {
			return nil, fmt.Errorf("#VideoValues.%s: want one pattern and one message, got %q %q", key, s.patterns, s.messages)
		}
		// Map-index form: self.nginx.values.rate_limit.matches(re) blows
		// the CEL cost budget, self.nginx.values['rate_limit'] does not.
		out = append(out, rule(fmt.Sprintf(`!%s || !has(self.nginx.values) || !(%s in self.nginx.values) || self.nginx.values[%[2]s].matches(%s)`,
			isVideo, celString(key), celString(s.patterns[0])), s.messages[0], ".nginx.values"))
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return nil, fmt.Errorf("#VideoValues has no fields")
	}
	// Every key is a video key ⇔ the map has as many keys as the video
	// keys it contains: constant-size iteration, so the CEL cost estimate
	// stays small however many values a route has (iterating the map's
	// keys is over budget, and so is naming the bad key in the message).
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = celString(k)
	}
	r := rule(fmt.Sprintf(`!%s || !has(self.nginx.values) || size(self.nginx.values) == [%s].filter(k, k in self.nginx.values).size()`,
		isVideo, strings.Join(quoted, ", ")), "a key"+msgVideoKey, ".nginx.values")
	// No messageExpression naming the key: iterating the map's keys in it
	// is over the CEL cost budget (1.4x with a list, 1.8x with a map
	// literal), so the message says "a key".
	out = append(out, r)
	return out, nil
}
