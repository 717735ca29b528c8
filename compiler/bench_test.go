package compiler

import (
	"fmt"
	"testing"

	"github.com/modelsphere/autoconfig/schema/routespec"
)

// benchSnapshot has n backends (IPv4, a few IPv6), built in an order that is
// not sorted and then normalised as discovery does, plus both VIPs, CART and
// nginx pods.
func benchSnapshot(n int) Snapshot {
	s := Snapshot{
		BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 8000},
		CartService:    &ServiceVIP{IP: "10.96.0.20", Port: 9000},
		CartPods:       []Endpoint{{IP: "10.3.0.2", Port: 9000}, {IP: "10.3.0.1", Port: 9000}},
		NginxPods:      []Endpoint{{IP: "10.4.0.1", Port: 8080}},
	}
	for i := n - 1; i >= 0; i-- {
		ip := fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256)
		if i%10 == 9 {
			ip = fmt.Sprintf("fd00::%x", i)
		}
		s.Backends = append(s.Backends, Endpoint{IP: ip, Port: 8000, Ready: true, GPUProduct: "NVIDIA-H100-80GB-HBM3"})
	}
	return normalized(s)
}

func benchLLMRoute() *Route {
	r := llmRoute("qwen", map[string]string{"tps_limit_tps": "30", "default_max": "64", "health_probe_path": "/v1/models"},
		routespec.Peer{Use: "cart", Priority: 3, MaxConcurrencyFromBackend: true},
		routespec.Peer{Use: "backend", Priority: 2, MaxConcurrency: 100},
		routespec.Peer{Use: "backend-svc", Priority: 1})
	r.Spec.Cart = &routespec.Cart{Discovery: routespec.Discovery{Service: "qwen-cart"}, OutputConfigMap: "qwen-cart-config", MaxLoad: 20}
	r.Spec.Monitor = &routespec.Monitor{OutputConfigMap: "monitoring/monitor-conf", Model: "Qwen/Qwen2.5-72B-Instruct"}
	r.Spec.SLO = &routespec.SLO{TTFTMs: 2000, DecodeTokensPerSecond: 20}
	return r
}

// BenchmarkCompile measures Compile, which renders the route file and the
// monitor file (the CART config is rendered lazily: BenchmarkRenderCart).
func BenchmarkCompile(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		r, s := benchLLMRoute(), benchSnapshot(n)
		b.Run(fmt.Sprintf("llm-%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Compile(r, s, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, n := range []int{10, 1000} {
		r := videoRoute("wan-video", map[string]string{"rate_limit": "200Mbps", "upload_conn_limit": "4", "upload_req_limit": "10r/s",
			"upload_req_burst": "20", "api_keys": "sk-video-1,sk-video-2"},
			routespec.Peer{Use: "backend", Priority: 2}, routespec.Peer{Use: "backend-svc", Priority: 1})
		s := benchSnapshot(n)
		b.Run(fmt.Sprintf("video-%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Compile(r, s, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRenderCart measures the rewrite of config.yaml (the controller
// renders it on every endpoint change; autoconfig compile once), from the
// compiled route to the bytes.
func BenchmarkRenderCart(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		res, err := Compile(benchLLMRoute(), benchSnapshot(n), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("workers-%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := res.Outputs[1].Render([]byte(cartBase)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
