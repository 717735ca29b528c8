package compiler

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseSnapshot(t *testing.T) {
	want := Snapshot{
		Backends:       []Endpoint{{IP: "10.0.0.3", Port: 8000, Ready: true, Node: "gpu-a", GPUProduct: "H100"}, {IP: "fd00::a", Port: 8000}},
		BackendService: &ServiceVIP{IP: "10.96.0.10", Port: 8000},
		CartPods:       []Endpoint{{IP: "10.0.1.1", Port: 9000, Ready: true}},
	}
	for name, src := range map[string]string{
		"yaml": `# comment
backends:
- {ip: 10.0.0.3, port: 8000, ready: yes, node: gpu-a, gpuProduct: H100}
- ip: fd00::a
  port: 8000
backendService: {ip: 10.96.0.10, port: 8000}
cartService: null
cartPods: &pods [{ip: 10.0.1.1, port: 9000, ready: true}]
nginxPods:
`,
		"json":              `{"backends": [{"ip": "10.0.0.3", "port": 8000, "ready": true, "node": "gpu-a", "gpuProduct": "H100"}, {"ip": "fd00::a", "port": 8000}], "backendService": {"ip": "10.96.0.10", "port": 8000}, "cartPods": [{"ip": "10.0.1.1", "port": 9000, "ready": true}]}`,
		"names ignore case": "Backends: [{IP: 10.0.0.3, port: 8000, ready: true, node: gpu-a, gpuproduct: H100}, {ip: fd00::a, port: 8000}]\nbackendservice: {ip: 10.96.0.10, port: 8000}\ncartPods: [{ip: 10.0.1.1, port: 9000, ready: true}]\n",
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseSnapshot("s.yaml", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
	if got, err := ParseSnapshot("s.yaml", []byte("# nothing\n")); err != nil || !reflect.DeepEqual(got, Snapshot{}) {
		t.Errorf("empty file: %+v, %v", got, err)
	}
}

// Every problem is file:line:column: field: message, one a line.
func TestParseSnapshotErrors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"wrong type", "backends:\n- ip: 10.0.0.1\n  port: 80\n- ip: 10.0.0.2\n  port: eighty\n", []string{
			`s.yaml:5:9: backends.1.port: want a whole number, got "eighty"`}},
		{"out of range", "backends: [{ip: 10.0.0.1, port: 99999999999}]\n", []string{
			`s.yaml:1:33: backends.0.port: want a whole number from -2147483648 to 2147483647, got "99999999999"`}},
		{"quoted number", "backends: [{ip: 10.0.0.1, port: \"80\", ready: \"true\"}]\n", []string{
			`s.yaml:1:33: backends.0.port: want a whole number, got "80"`,
			`s.yaml:1:46: backends.0.ready: want true or false, got "true"`}},
		{"number for a string", "backends: [{ip: 10.5, port: 80}]\n", []string{
			`s.yaml:1:17: backends.0.ip: want a string, got "10.5": quote it if it is one`}},
		{"unknown field", "backend: [{ip: 10.0.0.1, port: 80}]\n", []string{
			`s.yaml:1:1: backend: unknown field "backend"; the fields here are backends, backendService, cartService, cartPods, nginxPods, canaryBackends`}},
		{"list for a mapping", "backendService: [10.96.0.1]\nbackends: {ip: 10.0.0.1}\n", []string{
			`s.yaml:1:17: backendService: want a mapping (field: value), got a list`,
			`s.yaml:2:11: backends: want a list, got a mapping`}},
		{"repeated key", "backends: [{ip: 10.0.0.1, port: 80}]\ncartPods: []\nbackends: [{ip: 10.0.0.2, port: 80}]\n", []string{
			`s.yaml:3:1: backends: key "backends" repeats the one on line 1: a mapping holds each key once; delete one of them`}},
		{"repeated field of an endpoint", "backends:\n- ip: 10.0.0.1\n  port: 80\n  ip: 10.0.0.2\n", []string{
			`s.yaml:4:3: backends.0.ip: key "ip" repeats the one on line 2: a mapping holds each key once; delete one of them`}},
		{"syntax", "backends: [\n", []string{
			`s.yaml:1: parse yaml: did not find expected node content`}},
		{"two documents", "backends: []\n---\nbackends: []\n", []string{
			`s.yaml:2: a snapshot is one YAML document; a second one starts here: remove it`}},
		{"deep", "backends: " + strings.Repeat("[", 50000) + "\n", []string{
			`s.yaml:1:110: nesting deeper than 100 levels; an endpoint snapshot needs fewer than 4: is the file generated?`}},
		{"not utf-8", "backends:\n- {ip: 10.0.0.1, node: \"a\xfe\"}\n", []string{
			`s.yaml:2:26: byte 0xfe is not UTF-8: YAML files must be UTF-8 (or UTF-16 with a byte-order mark); save the file as UTF-8`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSnapshot("s.yaml", []byte(c.src))
			var se *SnapshotError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *SnapshotError", err)
			}
			if got := strings.Join(se.Problems, "\n"); got != strings.Join(c.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", got, strings.Join(c.want, "\n"))
			}
		})
	}
}
