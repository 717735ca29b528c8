package main

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/modelsphere/autoconfig/internal/charttest"
	"github.com/modelsphere/autoconfig/internal/nginxtest"
	"github.com/modelsphere/autoconfig/internal/testbin"
)

// TestChartMetricsServed: every hagate metric the chart's alerts and
// dashboard read is in a scrape of the running hagate binary's /metrics.
func TestChartMetricsServed(t *testing.T) {
	read, err := charttest.MetricsRead(testbin.Root(t))
	if err != nil {
		t.Fatal(err)
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
	owned, missing := charttest.ScrapeLacks(read, "hagate", string(body))
	if owned == 0 {
		t.Errorf("the chart reads no hagate metric (read %v)", read)
	}
	if len(missing) > 0 {
		t.Errorf("a scrape of hagate lacks %v, which the chart reads:\n%s", missing, body)
	}
}
