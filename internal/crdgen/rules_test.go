package crdgen

import (
	"strings"
	"testing"

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
