package crdgen

import (
	"context"
	"strings"
	"testing"

	"github.com/modelsphere/autoconfig/internal/celcheck"
	"github.com/modelsphere/autoconfig/schema"
)

// TestRulesFollowCUE: the messages and regexes copied from CUE
// comprehensions (which the walker cannot read) must still be in the
// schema verbatim; otherwise the CRD says something CUE no longer does.
func TestRulesFollowCUE(t *testing.T) {
	src, err := schema.FS.ReadFile(schema.SchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	cue := string(src)
	for _, m := range copiedMessages {
		if !strings.Contains(cue, m) {
			t.Errorf("message not in %s any more (update rules.go): %q", schema.SchemaFile, m)
		}
	}
	for _, re := range copiedRegexes {
		quoted := strings.ReplaceAll(re, `\`, `\\`)
		if !strings.Contains(cue, `"`+quoted+`"`) {
			t.Errorf("regex not in %s any more (update rules.go): %q", schema.SchemaFile, re)
		}
	}
}

func TestPatternMaxLen(t *testing.T) {
	for _, c := range []struct {
		re   string
		want int64
		ok   bool
	}{
		{`^[a-z]{1,63}$`, 63, true},
		{`^(a|bcd)$`, 3, true},
		{`^a$|^bb$`, 2, true},
		{`^a+$`, 0, false},
		{`[a-z]{1,3}`, 0, false}, // unanchored: longer strings match
		{`^a{1,3}`, 0, false},
		{`^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`, 127, true},
	} {
		got, ok := patternMaxLen(c.re)
		if got != c.want || ok != c.ok {
			t.Errorf("patternMaxLen(%q) = %d, %v; want %d, %v", c.re, got, ok, c.want, c.ok)
		}
	}
}

// A value far longer than a duration's pattern allows still reads the
// duration rule's message: the maxLength a pattern implies is at least
// patternSlack, so the API server's "Too long: may not be more than 5
// bytes" (which skips every rule) is not what a 20-digit holdTimeout
// gets. The in-process validator is the API server's (TestThreeJudges).
func TestLongValueReadsTheRule(t *testing.T) {
	res, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	v, err := celcheck.New(res.CRD)
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{
		"apiVersion": "routing.modelsphere.dev/v1alpha1", "kind": "ModelRoute",
		"metadata": map[string]any{"name": "qwen", "namespace": "llm"},
		"spec": map[string]any{
			"discovery":   map[string]any{"service": "qwen"},
			"nginx":       map[string]any{"outputConfigMap": "conf", "peers": []any{map[string]any{"use": "backend"}}},
			"scaleToZero": map[string]any{"target": map[string]any{"kind": "Deployment", "name": "qwen"}, "holdTimeout": "12345678901234567890s"},
		},
	}
	errs := v.Validate(context.Background(), obj)
	got := errs.ToAggregate()
	if got == nil || !strings.Contains(got.Error(), "scaleToZero.holdTimeout must be a duration from 1s to 1h") || strings.Contains(got.Error(), "Too long") {
		t.Fatalf("a 20-digit holdTimeout: %v; want the duration rule's message", got)
	}
}
