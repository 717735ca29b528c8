package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/charttest"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testenv"
)

// TestChartMetricsServed: every hagate metric the chart's alerts and
// dashboard read is in a scrape of the running hagate binary's /metrics.
func TestChartMetricsServed(t *testing.T) {
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	read, err := charttest.MetricsRead(root)
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	for _, n := range read {
		if charttest.MetricOwner(n) == "hagate" {
			mine = append(mine, n)
		}
	}
	if len(mine) == 0 {
		t.Fatalf("the chart reads no hagate metric (read %v)", read)
	}
	port, err := nginxtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := newCluster(t)
	c.addReplica("router-a", "--metrics-addr="+addr)
	c.w.waitFor(t, settle, "one active pod", exactlyOneActive())
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `autoconfig_build_info{binary="hagate"`) {
		t.Errorf("a scrape of hagate lacks autoconfig_build_info")
	}
	if missing := charttest.MissingFromScrape(mine, string(body)); len(missing) > 0 {
		t.Errorf("the chart reads %v, which a scrape of hagate lacks:\n%s", missing, body)
	}
}
