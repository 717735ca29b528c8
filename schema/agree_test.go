package schema

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelsphere/autoconfig/schema/v1alpha1"
)

// TestObjectAgreesWithVet: a route read back from the API server
// (ValidateObject) and the same route as YAML (Validate, as `autoconfig
// vet` reads it) get the same verdict for strings with the characters
// JSON, YAML and CUE treat specially: a byte order mark, NUL, line and
// paragraph separators, NEL, non-characters, invalid UTF-8 (which
// encoding/json, like the API server, turns into U+FFFD). Before the
// escape in ValidateObject a U+FEFF value was valid for vet and "invalid
// JSON" for the controller, which retried it forever.
func TestObjectAgreesWithVet(t *testing.T) {
	v, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a\ufeffb", "\ufeff", "\ufeff\ufeff", "a\x00b", "a\u2028b", "a\u2029b", "a\u0085b", "\ufffe", "\uffff", "a\xffb", "\U0010ffff", "\\ufeff", `"\ufeff"`} {
		for _, where := range []string{"value", "key", "probePath"} {
			r := &v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "n"}}
			r.Spec.Discovery.Service = "q"
			r.Spec.Nginx.OutputConfigMap = "c"
			r.Spec.Nginx.Peers = []v1alpha1.Peer{{Use: "backend", Priority: 2}}
			switch where {
			case "value":
				r.Spec.Nginx.Values = map[string]string{"x": s}
			case "key":
				r.Spec.Nginx.Values = map[string]string{"x" + s: "v"}
			case "probePath":
				r.Spec.Nginx.Peers[0].ProbePath = "/" + s
			}
			_, objErr := v.ValidateObject(r)
			if objErr != nil {
				if _, ok := objErr.(*InvalidError); !ok {
					t.Errorf("%s %q: the object cannot be validated: %v", where, s, objErr)
					continue
				}
			}
			// The same route as the API server stores it (JSON is YAML).
			stored, _ := json.Marshal(map[string]any{
				"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind,
				"metadata": map[string]any{"name": "q", "namespace": "n"}, "spec": r.Spec,
			})
			// kubectl get -o json, and -o yaml (its YAML emitter).
			var obj any
			if err := json.Unmarshal(stored, &obj); err != nil {
				t.Fatal(err)
			}
			asYAML, err := yaml.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			for form, src := range map[string][]byte{"json": stored, "yaml": asYAML} {
				_, vetErr := v.Validate("route."+form, src)
				if (objErr == nil) != (vetErr == nil) {
					t.Errorf("%s %q as %s: object %v, vet %v", where, s, form, objErr, vetErr)
				}
			}
		}
	}
}

// TestCUEDecoderPanicIsJudged: CUE v0.17.1's YAML decoder panics on this
// route (found by the compiler's property test); vet neither crashes nor
// calls it unparsable, but judges its data as the API server would: here
// the over-long api_keys value.
func TestCUEDecoderPanicIsJudged(t *testing.T) {
	v, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("testdata", "cue-yaml-decoder-panic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Validate("cue-yaml-decoder-panic.yaml", src)
	var inv *InvalidError
	if !errors.As(err, &inv) || !strings.Contains(err.Error(), "spec.nginx.values.api_keys: each value must be a string") {
		t.Fatalf("got %v; want the schema's verdict on the data", err)
	}
}
