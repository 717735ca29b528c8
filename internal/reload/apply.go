package reload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

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

// applier, in API mode, writes the desired content of its Source into
// the --write-dir (one of the watched directories), holding back the keys
// whose new version fails the check (quarantine).
type applier struct {
	*env
	source     Source
	dir        string // --write-dir
	check      *checker
	writeFiles func(dir string, files map[string][]byte, now time.Time) (bool, error) // WriteAtomic; only tests replace it

	// State, owned by Run's goroutine.
	applied    map[string][]byte // the accepted content the --write-dir shows
	appliedFor string            // version of the desired content applied
	refusedFor string            // version whose check failed even without its changes
	quarantine map[string]quarantined
}

// setSource makes r take its content from src, written into dir (one of its
// watched directories): New does so with a ConfigMapSync for --configmap
// and --write-dir.
func setSource(r *Reloader, src Source, dir string) {
	r.api = &applier{env: r.env, source: src, dir: dir, check: r.sig.check, writeFiles: WriteAtomic}
	r.sig.quarantined = r.api.quarantinedKeys
}

// start reads what the --write-dir shows at start, taken as applied, and
// returns the channel of the Source's changes.
func (a *applier) start() (<-chan struct{}, error) {
	var err error
	if a.applied, err = readFiles(a.dir); err != nil {
		return nil, fmt.Errorf("read --write-dir: %w", err)
	}
	return a.source.Changed(), nil
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
func (a *applier) apply(ctx context.Context, force bool) next {
	desired, version, ok := a.source.Desired()
	if !ok || (!force && (version == a.appliedFor || version == a.refusedFor)) {
		// Applied, or refused as a whole (the check fails without its
		// changes too): only a new version or the resync tries again —
		// not the events of our own trial writes, which would otherwise
		// repeat the search every debounce.
		return nextDone
	}
	a.refusedFor = ""
	if !a.check.enabled() {
		if err := a.write(desired); err != nil {
			return nextRetry
		}
		a.applied = desired
	} else if n := a.search(ctx, desired); n != nextDone {
		if n == nextResync {
			a.refusedFor = version
		}
		return n
	}
	a.appliedFor = version
	a.source.Applied()
	return nextDone
}

func (a *applier) search(ctx context.Context, desired map[string][]byte) next {
	changed := changedKeys(a.applied, desired)
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
	base := overlay(a.applied, desired, tables)
	if len(changed) == 0 {
		// Nothing new to check; a failed write may have left the links
		// half done.
		if err := a.write(base); err != nil {
			return nextRetry
		}
		a.applied = base
		a.setQuarantine(desired, nil)
		return nextDone
	}
	accepted := base
	refused := map[string]string{} // key → check output
	var writeErr error
	// try writes accepted plus the desired version of keys and checks it.
	try := func(keys []string) bool {
		cand := overlay(accepted, desired, keys)
		if writeErr = a.write(cand); writeErr != nil {
			return false
		}
		snap, err := a.snapshot(a.dirs)
		if err != nil {
			writeErr = err
			return false
		}
		if err := a.check.run(ctx); err != nil {
			for _, k := range keys {
				refused[k] = err.Error()
			}
			if len(keys) == 0 {
				refused[""] = err.Error()
			}
			return false
		}
		if id, err := ContentID(a.dirs); err == nil && id == snap.ID {
			a.check.passed = snap.Fingerprint
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
		if q, ok := a.quarantine[k]; ok && q.hash == versionHash(desired, k) {
			suspects = append(suspects, k)
		} else {
			rest = append(rest, k)
		}
	}
	if !one(rest, true) || !one(suspects, false) {
		a.log.Error("cannot write the configmap's keys; retrying", "dir", a.dir, "err", writeErr)
		return nextRetry
	}
	if len(bad) == len(changed) && !try(nil) {
		if writeErr != nil {
			a.log.Error("cannot write the configmap's keys; retrying", "dir", a.dir, "err", writeErr)
			return nextRetry
		}
		// Not the new versions' fault: the check fails without them too.
		a.metrics.Reloads.WithLabelValues(ResultCheckFailed).Inc()
		a.log.Error("configuration check fails on the last good content too, so no key is to blame: nothing quarantined, nothing signalled; retried at the next change or resync",
			"keys", changed, "err", refused[""])
		a.setQuarantine(desired, nil)
		return nextResync
	}
	// The last try may have failed: show the accepted content.
	if err := a.write(accepted); err != nil {
		return nextRetry
	}
	a.applied = accepted
	q := make(map[string]quarantined, len(bad))
	for _, k := range bad {
		q[k] = quarantined{hash: versionHash(desired, k), err: refused[k]}
	}
	a.setQuarantine(desired, q)
	return nextDone
}

// setQuarantine replaces the quarantine with q, logging what entered and
// left it. The gauge is set first, so whoever reads the log line finds the
// metric already saying so.
func (a *applier) setQuarantine(desired map[string][]byte, q map[string]quarantined) {
	prev := a.quarantine
	a.quarantine = q
	a.metrics.QuarantinedKeys.Set(float64(len(q)))
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if old, ok := prev[k]; ok && old.hash == q[k].hash {
			continue
		}
		_, present := desired[k]
		a.log.Error("quarantined: the new version of this key fails the check; its last good version stays and every other key is loaded",
			"key", k, "removal", !present, "err", q[k].err)
	}
	for _, k := range slices.Sorted(maps.Keys(prev)) {
		if _, ok := q[k]; !ok {
			a.log.Info("released from quarantine: the key's current version is loaded", "key", k)
		}
	}
}

func (a *applier) quarantinedKeys() []string {
	if len(a.quarantine) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(a.quarantine))
}

// peersOnly reports whether the desired content differs from what is
// applied in peers tables only (changed, never added or removed): a push
// costs a millisecond and needs no check, so it need not wait for quiet.
func (a *applier) peersOnly() bool {
	desired, _, ok := a.source.Desired()
	if !ok || len(desired) != len(a.applied) {
		return false
	}
	changed := changedKeys(a.applied, desired)
	if len(changed) == 0 {
		return false
	}
	for _, k := range changed {
		if _, in := a.applied[k]; !in || !peers.IsKey(k) {
			return false
		}
	}
	return true
}

// write shows files in the --write-dir, counting the result.
func (a *applier) write(files map[string][]byte) error {
	changed, err := a.writeFiles(a.dir, files, a.now())
	switch {
	case err != nil:
		a.metrics.ConfigMapWrites.WithLabelValues("error").Inc()
		a.log.Error("cannot write the configmap's keys; retrying", "dir", a.dir, "err", err)
	case changed:
		a.metrics.ConfigMapWrites.WithLabelValues("written").Inc()
		a.metrics.LastConfigMapWrite.Set(float64(a.now().Unix()))
		a.log.Debug("wrote the configmap's keys", "dir", a.dir, "keys", len(files))
	default:
		a.metrics.ConfigMapWrites.WithLabelValues("unchanged").Inc()
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
