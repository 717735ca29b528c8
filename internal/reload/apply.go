package reload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"

	"github.com/modelsphere/autoconfig/internal/peers"
)

// Source supplies, in API mode, the content the sidecar writes into its
// --write-dir (ConfigMapSync).
type Source interface {
	// Desired is the content to show, with a version that changes with
	// it; ok is false until the first listing.
	Desired() (files map[string][]byte, version string, ok bool)
	// Changed receives a value after Desired changed (capacity 1).
	Changed() <-chan struct{}
	// Applied is called each time the desired content, less quarantined
	// keys, is on disk.
	Applied()
}

// quarantined is a key whose new version the check refused: its last good
// version (or nothing, for a new key) stays on disk.
type quarantined struct {
	hash string // of the refused version ("" = the key's removal)
	err  string // the check's output
}

// apply writes the desired content into the --write-dir. Without
// --check-cmd it is written as is. With it, every version on disk has
// passed the check: when the whole desired content fails, the keys whose
// new version causes it are found (one check per changed key at most) and
// quarantined — their last good version stays — and the rest is written,
// so one broken route never holds back the others.
func (r *Reloader) apply(ctx context.Context, force bool) next {
	desired, version, ok := r.source.Desired()
	if !ok || (!force && (version == r.appliedFor || version == r.refusedFor)) {
		// Applied, or refused as a whole (the check fails without its
		// changes too): only a new version or the resync tries again —
		// not the events of our own trial writes, which would otherwise
		// repeat the search every debounce.
		return nextDone
	}
	r.refusedFor = ""
	if len(r.checkCmd) == 0 {
		if err := r.write(desired); err != nil {
			return nextRetry
		}
		r.applied = desired
	} else if n := r.search(ctx, desired); n != nextDone {
		if n == nextResync {
			r.refusedFor = version
		}
		return n
	}
	r.appliedFor = version
	r.source.Applied()
	return nextDone
}

func (r *Reloader) search(ctx context.Context, desired map[string][]byte) next {
	changed := changedKeys(r.applied, desired)
	// Peers tables (dynamic peers) are no nginx configuration: the check
	// says nothing about them and is not run for them (the engine checks
	// a table when it is pushed). They are taken as they come.
	var tables []string
	changed = slices.DeleteFunc(changed, func(k string) bool {
		if peers.IsKey(k) {
			tables = append(tables, k)
			return true
		}
		return false
	})
	base := overlay(r.applied, desired, tables)
	if len(changed) == 0 {
		// Nothing new to check; a failed write may have left the links
		// half done.
		if err := r.write(base); err != nil {
			return nextRetry
		}
		r.applied = base
		r.setQuarantine(desired, nil)
		return nextDone
	}
	accepted := base
	refused := map[string]string{} // key → check output
	var writeErr error
	// try writes accepted plus the desired version of keys and checks it.
	try := func(keys []string) bool {
		cand := overlay(accepted, desired, keys)
		if writeErr = r.write(cand); writeErr != nil {
			return false
		}
		snap, err := r.snapshot(r.dirs)
		if err != nil {
			writeErr = err
			return false
		}
		if err := r.check(ctx); err != nil {
			for _, k := range keys {
				refused[k] = err.Error()
			}
			if len(keys) == 0 {
				refused[""] = err.Error()
			}
			return false
		}
		if id, err := ContentID(r.dirs); err == nil && id == snap.ID {
			r.checked = snap.Fingerprint
		}
		accepted = cand
		return true
	}
	// one tries keys together (when together is set) and then one by one.
	var bad []string
	one := func(keys []string, together bool) bool {
		if len(keys) == 0 {
			return true
		}
		if together {
			if try(keys) {
				return true
			}
			if writeErr != nil {
				return false
			}
			if len(keys) == 1 {
				bad = append(bad, keys[0])
				return true
			}
		}
		for _, k := range keys {
			if !try([]string{k}) {
				if writeErr != nil {
					return false
				}
				bad = append(bad, k)
			}
		}
		return true
	}
	// Keys refused before with the same version are suspects: the rest is
	// tried first, together, then each suspect alone.
	var suspects, rest []string
	for _, k := range changed {
		if q, ok := r.quarantine[k]; ok && q.hash == versionHash(desired, k) {
			suspects = append(suspects, k)
		} else {
			rest = append(rest, k)
		}
	}
	if !one(rest, true) || !one(suspects, false) {
		r.log.Error("cannot write the configmap's keys; retrying", "dir", r.writeDir, "err", writeErr)
		return nextRetry
	}
	if len(bad) == len(changed) && !try(nil) {
		if writeErr != nil {
			r.log.Error("cannot write the configmap's keys; retrying", "dir", r.writeDir, "err", writeErr)
			return nextRetry
		}
		// Not the new versions' fault: the check fails without them too.
		r.metrics.Reloads.WithLabelValues(ResultCheckFailed).Inc()
		r.log.Error("configuration check fails on the last good content too, so no key is to blame: nothing quarantined, nothing signalled; retried at the next change or resync",
			"keys", changed, "err", refused[""])
		r.setQuarantine(desired, nil)
		return nextResync
	}
	// The last try may have failed: show the accepted content.
	if err := r.write(accepted); err != nil {
		return nextRetry
	}
	r.applied = accepted
	q := make(map[string]quarantined, len(bad))
	for _, k := range bad {
		q[k] = quarantined{hash: versionHash(desired, k), err: refused[k]}
	}
	r.setQuarantine(desired, q)
	return nextDone
}

// setQuarantine replaces the quarantine with q, logging what entered and
// left it.
func (r *Reloader) setQuarantine(desired map[string][]byte, q map[string]quarantined) {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if old, ok := r.quarantine[k]; ok && old.hash == q[k].hash {
			continue
		}
		_, present := desired[k]
		r.log.Error("quarantined: the new version of this key fails the check; its last good version stays and every other key is loaded",
			"key", k, "removal", !present, "err", q[k].err)
	}
	for _, k := range slices.Sorted(maps.Keys(r.quarantine)) {
		if _, ok := q[k]; !ok {
			r.log.Info("released from quarantine: the key's current version is loaded", "key", k)
		}
	}
	r.quarantine = q
	r.metrics.QuarantinedKeys.Set(float64(len(q)))
}

func (r *Reloader) quarantinedKeys() []string {
	if len(r.quarantine) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(r.quarantine))
}

// write shows files in the --write-dir, counting the result.
func (r *Reloader) write(files map[string][]byte) error {
	changed, err := r.writeFiles(r.writeDir, files, r.now())
	switch {
	case err != nil:
		r.metrics.ConfigMapWrites.WithLabelValues("error").Inc()
		r.log.Error("cannot write the configmap's keys; retrying", "dir", r.writeDir, "err", err)
	case changed:
		r.metrics.ConfigMapWrites.WithLabelValues("written").Inc()
		r.metrics.LastConfigMapWrite.Set(float64(r.now().Unix()))
		r.log.Debug("wrote the configmap's keys", "dir", r.writeDir, "keys", len(files))
	default:
		r.metrics.ConfigMapWrites.WithLabelValues("unchanged").Inc()
	}
	return err
}

// changedKeys are the keys whose content differs between a and b
// (including keys only in one of them), sorted.
func changedKeys(a, b map[string][]byte) []string {
	var ks []string
	for k, v := range b {
		if w, ok := a[k]; !ok || !bytes.Equal(v, w) {
			ks = append(ks, k)
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// overlay is base with the desired version of keys (absent = removed).
func overlay(base, desired map[string][]byte, keys []string) map[string][]byte {
	out := maps.Clone(base)
	if out == nil {
		out = map[string][]byte{}
	}
	for _, k := range keys {
		if v, ok := desired[k]; ok {
			out[k] = v
		} else {
			delete(out, k)
		}
	}
	return out
}

// versionHash identifies the desired version of key ("" = absent).
func versionHash(files map[string][]byte, key string) string {
	v, ok := files[key]
	if !ok {
		return ""
	}
	h := sha256.Sum256(v)
	return hex.EncodeToString(h[:])
}

// ContentVersion identifies a whole key set.
func ContentVersion(files map[string][]byte) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(files)) {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write(files[k])
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// failingKeys are the visible files of dirs that a check's output names
// (nginx: "… in /etc/nginx/routes/<key>:3"), so a refused change in a
// read-only mount still says which key to fix.
func failingKeys(out string, dirs []string) []string {
	var keys []string
	for _, d := range dirs {
		files, err := readFiles(d)
		if err != nil {
			continue
		}
		for k := range files {
			if mentions(out, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// mentions reports whether out names file as a whole path element.
func mentions(out, name string) bool {
	for i := 0; ; {
		j := strings.Index(out[i:], name)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || strings.ContainsRune("/ \t\"'(", rune(out[j-1]))
		end := j + len(name)
		after := end == len(out) || !isNameByte(out[end])
		if before && after {
			return true
		}
		i = j + 1
	}
}

func isNameByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
