package compiler

import (
	"slices"
	"strings"
)

// renderMonitor writes <model>.monitor.conf (format in docs/outputs.md):
// one "service:" line per backend (the canary's with version=canary), then "nginx:" lines for the entry pods
// and "router:" lines for the CART pods when enabled.
func (c *compilation) renderMonitor(model string) []byte {
	mon := c.route.Spec.Monitor
	gpu := mon.GPUType
	if gpu == "" {
		var disagree []string
		gpu, disagree = backendGPU(c.backends)
		if len(disagree) > 0 {
			c.warnf("monitor gpu type left empty: backends run different GPUs (%s); set spec.monitor.gpuType", strings.Join(disagree, ", "))
		}
	}
	withNginx := len(c.nginxPods) > 0
	if mon.Nginx != nil {
		withNginx = *mon.Nginx
		if withNginx && len(c.nginxPods) == 0 {
			c.warnf("spec.monitor.nginx is true but no nginx entry pods were discovered (set spec.nginx.service or selector); no nginx: lines written")
		}
	}
	withRouter := c.route.Spec.Cart != nil
	if mon.Router != nil {
		withRouter = *mon.Router
	}
	if withRouter && len(c.cartPods) == 0 {
		c.warnf("monitor router: lines enabled but no CART pods were discovered; no router: lines written")
	}

	b := make([]byte, 0, 256+(80+len(model))*len(c.backends)+64*(len(c.nginxPods)+len(c.cartPods)))
	b = c.appendHeaderLine(b, MonitorKey(model))
	for i := range c.backends {
		b = append(b, "service: model="...)
		b = append(b, model...)
		b = append(b, " gpu_type="...)
		b = append(b, gpu...)
		b = append(b, " endpoint="...)
		b = c.backends[i].appendHostPort(b)
		b = append(b, '\n')
	}
	// The canary's backends (spec.canary): the same line with
	// version=canary at its end, so dashboards tell the versions apart;
	// their GPU is derived from their own labels unless gpuType is set.
	if len(c.canary) > 0 {
		cgpu := mon.GPUType
		if cgpu == "" {
			var disagree []string
			cgpu, disagree = backendGPU(c.canary)
			if len(disagree) > 0 {
				c.warnf("monitor gpu type of the canary left empty: canary backends run different GPUs (%s); set spec.monitor.gpuType", strings.Join(disagree, ", "))
			}
		}
		for i := range c.canary {
			b = append(b, "service: model="...)
			b = append(b, model...)
			b = append(b, " gpu_type="...)
			b = append(b, cgpu...)
			b = append(b, " endpoint="...)
			b = c.canary[i].appendHostPort(b)
			b = append(b, " version=canary\n"...)
		}
	}
	if withNginx {
		for i := range c.nginxPods {
			b = append(b, "nginx: endpoint="...)
			b = c.nginxPods[i].appendHostPort(b)
			b = append(b, '\n')
		}
	}
	if withRouter {
		for i := range c.cartPods {
			b = append(b, "router: url=http://"...)
			b = c.cartPods[i].appendHostPort(b)
			b = append(b, "/workers\n"...)
		}
	}
	return b
}

// backendGPU derives the backends' short GPU name. Backends without a
// (recognisable) label are ignored; when the others disagree the result is
// empty and disagree lists the names found.
func backendGPU(backends []endpoint) (gpu string, disagree []string) {
	var names []string
	last := "\x00"
	for i := range backends {
		label := backends[i].gpu
		if label == last {
			continue // one pool is mostly one GPU type: derive each label once
		}
		last = label
		if s := ShortGPU(label); s != "" && !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	switch len(names) {
	case 0:
		return "", nil
	case 1:
		return names[0], nil
	}
	slices.Sort(names)
	return "", names
}

// gpuWord reports whether s is a non-empty word of letters and digits.
func gpuWord(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}

// gpuVendorWords are dropped from the front of a product label.
var gpuVendorWords = map[string]bool{"NVIDIA": true, "Tesla": true, "GeForce": true, "Quadro": true}

// gpuSeriesWords join the following word: RTX-4090 → RTX4090,
// RTX-A6000 → RTXA6000.
var gpuSeriesWords = map[string]bool{"RTX": true, "GTX": true, "TITAN": true}

// ShortGPU turns an nvidia.com/gpu.product label, as GPU feature discovery
// writes it (the product name with spaces as '-'), into a short GPU name:
// split on '-', drop leading vendor/brand words (NVIDIA, Tesla, GeForce,
// Quadro), take the next word; after a series word (RTX, GTX, TITAN) also
// take an optional PRO and then the model word. Everything after the
// model (form factor, memory, generation, edition, MIG profile) is dropped:
//
//	NVIDIA-H100-80GB-HBM3                        → H100
//	NVIDIA-H20-3e                                → H20
//	NVIDIA-A100-SXM4-80GB                        → A100
//	NVIDIA-GeForce-RTX-4090                      → RTX4090
//	NVIDIA-RTX-A6000                             → RTXA6000
//	NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition → RTXPRO6000
//	NVIDIA-L40S                                  → L40S
//	Tesla-V100-SXM2-16GB                         → V100
//
// It returns "" for an empty label or one it cannot read (a name word with
// characters other than letters and digits).
func ShortGPU(product string) string {
	words := strings.Split(product, "-")
	i := 0
	for i < len(words) && gpuVendorWords[words[i]] {
		i++
	}
	if i >= len(words) || !gpuWord(words[i]) {
		return ""
	}
	name := words[i]
	if !gpuSeriesWords[strings.ToUpper(name)] {
		return name
	}
	i++
	if i < len(words) && strings.EqualFold(words[i], "PRO") {
		name += words[i]
		i++
	}
	if i < len(words) && gpuWord(words[i]) {
		name += words[i]
	}
	return name
}
