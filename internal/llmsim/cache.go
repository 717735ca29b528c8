package llmsim

import (
	"container/list"
	"crypto/sha256"
	"encoding/json"
)

// tokenCount is a text's token count: ceil(len(bytes)/4), so at least 1
// for a non-empty text and 0 for an empty one.
func tokenCount(s string) int { return (len(s) + 3) / 4 }

// completionBlock is the byte length of the prompt blocks /v1/completions
// caches: prompt[:256*i] for every whole block i.
const completionBlock = 256

// prefixKey names one prompt prefix in the cache.
type prefixKey struct {
	hash [sha256.Size]byte
	// tokens is the token count of the whole prefix: what a hit on it
	// saves.
	tokens int
	// cost is what the prefix adds over the one before it (the last
	// message, or the last block): what its entry occupies of the cache's
	// capacity, as a radix tree stores a shared prefix once.
	cost int
}

// chatKeys are the keys of messages[0..k) for k = 1..len(messages), in
// that order. The hash of prefix k is the sha256 of the JSON encodings of
// {role, content} of messages[0..k), each followed by a newline, after a
// "chat" domain line, so a chat prefix never equals a completion prefix.
func chatKeys(messages []Message) []prefixKey {
	h := sha256.New()
	h.Write([]byte("chat\n"))
	keys := make([]prefixKey, 0, len(messages))
	total := 0
	for _, m := range messages {
		// Marshalling a struct of two strings cannot fail.
		b, _ := json.Marshal(Message{Role: m.Role, Content: m.Content})
		h.Write(b)
		h.Write([]byte{'\n'})
		n := tokenCount(m.Content)
		total += n
		k := prefixKey{tokens: total, cost: n}
		h.Sum(k.hash[:0])
		keys = append(keys, k)
	}
	return keys
}

// textKeys are the keys of prompt[:256*i] for every whole 256-byte block
// i of the prompt, shortest first: the hash is the sha256 of the prefix
// after a "text" domain line.
func textKeys(prompt string) []prefixKey {
	h := sha256.New()
	h.Write([]byte("text\n"))
	var keys []prefixKey
	for end := completionBlock; end <= len(prompt); end += completionBlock {
		h.Write([]byte(prompt[end-completionBlock : end]))
		k := prefixKey{tokens: tokenCount(prompt[:end]), cost: completionBlock / 4}
		h.Sum(k.hash[:0])
		keys = append(keys, k)
	}
	return keys
}

// prefixCache is an LRU set of prompt prefixes holding at most capacity
// tokens (the sum of its entries' costs). It is not safe for concurrent
// use; the pod's mutex guards it.
//
// A request touches and inserts its prefixes longest first, so the
// shortest prefix of a conversation is the most recently used and the
// longest ones are evicted first, as a radix tree evicts its leaves.
type prefixCache struct {
	capacity int
	used     int
	lru      *list.List // of *prefixKey, the most recently used in front
	index    map[[sha256.Size]byte]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{capacity: capacity, lru: list.New(), index: map[[sha256.Size]byte]*list.Element{}}
}

// lookup returns the token count of the longest of keys (shortest first)
// that is cached, 0 for none, and marks the cached ones up to it used.
func (c *prefixCache) lookup(keys []prefixKey) int {
	hit, found := 0, false
	for i := len(keys) - 1; i >= 0; i-- {
		e, ok := c.index[keys[i].hash]
		if !ok {
			continue
		}
		if !found {
			hit, found = keys[i].tokens, true
		}
		c.lru.MoveToFront(e)
	}
	return hit
}

// insert caches every one of keys, evicting the least recently used
// entries while the cache holds more than its capacity. A key that alone
// costs more than the capacity is not cached.
func (c *prefixCache) insert(keys []prefixKey) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if e, ok := c.index[k.hash]; ok {
			c.lru.MoveToFront(e)
			continue
		}
		if k.cost > c.capacity {
			continue
		}
		c.index[k.hash] = c.lru.PushFront(&k)
		c.used += k.cost
		for c.used > c.capacity {
			old := c.lru.Remove(c.lru.Back()).(*prefixKey)
			delete(c.index, old.hash)
			c.used -= old.cost
		}
	}
}
