package compiler

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// CartWorker is one entry of the CART config.yaml workers list.
type CartWorker struct {
	// URL is http://ip:port (http://[ip]:port for IPv6).
	URL string
	// MaxLoad is the worker's max_load.
	MaxLoad int32
}

// cartWorkers lists the backends as CART workers, in endpoint order. The
// URLs share one string (not one allocation a worker).
func (c *compilation) cartWorkers() []CartWorker {
	maxLoad := c.route.Spec.Cart.MaxLoad
	if maxLoad <= 0 {
		maxLoad = 20
	}
	out := make([]CartWorker, len(c.backends))
	ends := make([]int, len(c.backends))
	buf := make([]byte, 0, 64)
	size := 0
	for i := range c.backends {
		size += len(c.backends[i].appendHostPort(buf[:0]))
	}
	var all strings.Builder
	all.Grow(size + len(c.backends)*len("http://"))
	for i := range c.backends {
		buf = append(buf[:0], "http://"...)
		buf = c.backends[i].appendHostPort(buf)
		all.Write(buf)
		ends[i] = all.Len()
	}
	urls, start := all.String(), 0
	for i, end := range ends {
		out[i] = CartWorker{URL: urls[start:end], MaxLoad: maxLoad}
		start = end
	}
	return out
}

// RenderCartConfig returns base (the CART chart's config.yaml) with its
// top-level workers list replaced by workers; every other key, its order and
// its comments stay as they are, and the workers key carries the mark of
// owner (OwnerRef of the route; "" = no mark). configMap only names the
// source in errors.
// A missing, empty or unparsable base is an error: the file belongs to the
// CART chart and is never written from scratch or overwritten.
func RenderCartConfig(base []byte, workers []CartWorker, configMap, owner string) ([]byte, error) {
	if base == nil {
		return nil, fmt.Errorf("%w: %s has no key %s: the CART chart must create its base config; autoconfig only rewrites the workers section", ErrCartBase, configMap, CartKey)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(base, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s %s is not valid YAML, left unchanged: %v", ErrCartBase, configMap, CartKey, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: %s %s is not a YAML mapping (server/cache/health/workers), left unchanged", ErrCartBase, configMap, CartKey)
	}
	if len(workers) > 0 && plainURLs(workers) {
		// yaml.v3 prints the document with two placeholder workers, and
		// the workers' own lines replace the placeholders' lines: its
		// emitter keeps every event of a document until the end (about
		// 9 KB a worker, 70 MB for 7,800), so it prints only the rest.
		out, err := encodeCart(&doc, cartPlaceholders[:], configMap, owner)
		if err != nil {
			return nil, err
		}
		if b, ok := spliceWorkers(out, workers); ok {
			return b, nil
		}
		// An unexpected layout: yaml.v3 prints the whole list.
		doc = yaml.Node{}
		if err := yaml.Unmarshal(base, &doc); err != nil {
			return nil, fmt.Errorf("%w: %s %s is not valid YAML, left unchanged: %v", ErrCartBase, configMap, CartKey, err)
		}
	}
	return encodeCart(&doc, workers, configMap, owner)
}

// encodeCart replaces the workers list of doc (a checked mapping document,
// modified in place) by workers and prints the document with yaml.v3.
func encodeCart(doc *yaml.Node, workers []CartWorker, configMap, owner string) ([]byte, error) {
	root := doc.Content[0]
	list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, w := range workers {
		list.Content = append(list.Content, &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: "url"},
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: w.URL},
			{Kind: yaml.ScalarNode, Tag: "!!str", Value: "max_load"},
			{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(int(w.MaxLoad))},
		}})
	}
	replaced := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "workers" {
			key, old := root.Content[i], root.Content[i+1]
			// Keep comments attached to the old value: a line comment
			// after "workers: []" belongs on the key line once the value
			// is a block sequence (yaml.v3 would print it after the list).
			if key.LineComment == "" {
				key.LineComment = old.LineComment
			}
			list.HeadComment, list.FootComment = old.HeadComment, old.FootComment
			if owner != "" {
				key.HeadComment = withCartMark(key.HeadComment, owner)
			}
			root.Content[i+1] = list
			replaced = true
			break
		}
	}
	if !replaced {
		key := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "workers"}
		if owner != "" {
			key.HeadComment = withCartMark("", owner)
		}
		root.Content = append(root.Content, key, list)
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", configMap, CartKey, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", configMap, CartKey, err)
	}
	return out.Bytes(), nil
}

// cartPlaceholders stand for the workers when yaml.v3 prints the document:
// URLs no endpoint renders to (not an IP) and two of them, so the lines
// of one worker are known to follow those of another.
var cartPlaceholders = [2]CartWorker{
	{URL: "http://autoconfig.workers.placeholder.invalid:1", MaxLoad: 1},
	{URL: "http://autoconfig.workers.placeholder.invalid:2", MaxLoad: 2},
}

// plainURLs reports whether every URL is http://IPv4:port or
// http://[IPv6]:port in the characters yaml.v3 prints as a plain scalar
// in a block sequence (no quotes, no escapes): hex digits, '.', ':', '[',
// ']', '/'. The compiler's URLs always are (canonical IPs, no zone);
// another URL makes RenderCartConfig print the list with yaml.v3.
func plainURLs(workers []CartWorker) bool {
	for i := range workers {
		u, ok := strings.CutPrefix(workers[i].URL, "http://")
		if !ok || u == "" || u[len(u)-1] < '0' || u[len(u)-1] > '9' {
			return false
		}
		for j := 0; j < len(u); j++ {
			switch c := u[j]; {
			case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F', c == '.', c == ':', c == '[', c == ']':
			default:
				return false
			}
		}
	}
	return true
}

// appendCartWorker appends one worker's lines as yaml.v3 prints an item of
// a block sequence whose "- " starts after indent.
func appendCartWorker(b []byte, indent string, w *CartWorker) []byte {
	b = append(b, indent...)
	b = append(b, "- url: "...)
	b = append(b, w.URL...)
	b = append(b, '\n')
	b = append(b, indent...)
	b = append(b, "  max_load: "...)
	b = strconv.AppendInt(b, int64(w.MaxLoad), 10)
	return append(b, '\n')
}

// spliceWorkers replaces the placeholders' lines in out (yaml.v3's print
// of the document with cartPlaceholders as its workers) by those of
// workers. ok is false unless the placeholders' lines are found exactly
// once, one worker after the other, in the layout appendCartWorker writes.
func spliceWorkers(out []byte, workers []CartWorker) (_ []byte, ok bool) {
	first := []byte("- url: " + cartPlaceholders[0].URL + "\n")
	at := bytes.Index(out, first)
	if at < 0 || bytes.Count(out, []byte(cartPlaceholders[0].URL)) != 1 || bytes.Count(out, []byte(cartPlaceholders[1].URL)) != 1 {
		return nil, false
	}
	line := bytes.LastIndexByte(out[:at], '\n') + 1
	indent := string(out[line:at])
	if strings.Trim(indent, " ") != "" {
		return nil, false
	}
	var want []byte
	for i := range cartPlaceholders {
		want = appendCartWorker(want, indent, &cartPlaceholders[i])
	}
	if !bytes.HasPrefix(out[line:], want) {
		return nil, false
	}
	size := len(out) - len(want)
	for i := range workers {
		size += 2*len(indent) + len("- url: \n  max_load: \n") + len(workers[i].URL) + 11
	}
	b := make([]byte, 0, size)
	b = append(b, out[:line]...)
	for i := range workers {
		b = appendCartWorker(b, indent, &workers[i])
	}
	return append(b, out[line+len(want):]...), true
}

// ErrCartBase is wrapped by RenderCartConfig's errors about the base
// config (missing, unparsable, not a mapping): retrying without a fix by the
// CART chart's owner cannot help.
var ErrCartBase = errors.New("unusable CART base config")
