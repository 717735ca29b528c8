package compiler

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// CartWorker is one entry of the CART config.yaml workers list.
type CartWorker struct {
	// URL is http://ip:port (http://[ip]:port for IPv6).
	URL string
	// MaxLoad is the worker's max_load.
	MaxLoad int32
}

// cartWorkers lists the backends as CART workers, in endpoint order.
func (c *compilation) cartWorkers() []CartWorker {
	maxLoad := c.route.Spec.Cart.MaxLoad
	if maxLoad <= 0 {
		maxLoad = 20
	}
	out := make([]CartWorker, len(c.backends))
	buf := make([]byte, 0, 64)
	for i := range c.backends {
		buf = append(buf[:0], "http://"...)
		buf = c.backends[i].appendHostPort(buf)
		out[i] = CartWorker{URL: string(buf), MaxLoad: maxLoad}
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
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", configMap, CartKey, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", configMap, CartKey, err)
	}
	return out.Bytes(), nil
}

// ErrCartBase is wrapped by RenderCartConfig's errors about the base
// config (missing, unparsable, not a mapping): retrying without a fix by the
// CART chart's owner cannot help.
var ErrCartBase = errors.New("unusable CART base config")
