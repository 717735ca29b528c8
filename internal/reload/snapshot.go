package reload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Kubelet's AtomicWriter layout of a ConfigMap volume: the data lives in a
// timestamped directory, "..data" is a symlink to it, and each key is a
// symlink "<key>" -> "..data/<key>". An update writes a new timestamped
// directory, points a new "..data_tmp" symlink at it and renames that over
// "..data" (the atomic step), then fixes the per-key links and removes the
// old directory. A timestamped directory is never modified after the
// rename, only replaced, and its name is never reused: the target of
// "..data" identifies the content.
const (
	dataDirName    = "..data"
	dataTmpName    = "..data_tmp"
	timestampDirFn = "2006_01_02_15_04_05."
)

// swapInProgress reports whether any dir holds "..data_tmp", which exists
// only between the two steps of a swap: acting then could see the old
// "..data" with new key links, so the caller waits for the next event.
func swapInProgress(dirs []string) bool {
	for _, d := range dirs {
		if _, err := os.Lstat(filepath.Join(d, dataTmpName)); err == nil {
			return true
		}
	}
	return false
}

// Snapshot is the content the watched directories show at one moment.
type Snapshot struct {
	// Fingerprint hashes the visible content (see Fingerprint).
	Fingerprint string
	// ID identifies the content cheaply: per directory, the resolved
	// "..data" target for kubelet's layout, else the directory's content
	// hash. The same ID later means nothing was swapped in between.
	ID string
	// Keys are the SHA-256 (hex) of each visible regular file, by name:
	// what the target serves once it loaded this content (the served
	// report, served.go). A name in several directories is the first's.
	Keys map[string]string
}

// TakeSnapshot fingerprints dirs with every kubelet directory pinned to the
// "..data" target resolved first, so a swap during the read cannot mix two
// versions: the fingerprint is exactly that of the content the ID names.
func TakeSnapshot(dirs []string) (Snapshot, error) {
	h := sha256.New()
	id := make([]string, 0, len(dirs))
	keys := map[string]string{}
	for _, d := range dirs {
		target := dataTarget(d)
		dh := sha256.New()
		if err := hashDir(io.MultiWriter(h, dh), d, target, keys); err != nil {
			return Snapshot{}, err
		}
		if target != "" {
			id = append(id, "data:"+target)
		} else {
			id = append(id, "hash:"+hex.EncodeToString(dh.Sum(nil)))
		}
	}
	return Snapshot{Fingerprint: hex.EncodeToString(h.Sum(nil)), ID: strings.Join(id, "\x00"), Keys: keys}, nil
}

// ContentID is the ID part of TakeSnapshot. For kubelet directories it
// costs one readlink each, so it can be taken right before a signal.
func ContentID(dirs []string) (string, error) {
	id := make([]string, 0, len(dirs))
	for _, d := range dirs {
		if target := dataTarget(d); target != "" {
			id = append(id, "data:"+target)
			continue
		}
		dh := sha256.New()
		if err := hashDir(dh, d, "", nil); err != nil {
			return "", err
		}
		id = append(id, "hash:"+hex.EncodeToString(dh.Sum(nil)))
	}
	return strings.Join(id, "\x00"), nil
}

// dataTarget is the directory "..data" points to ("" if d has no kubelet
// layout).
func dataTarget(d string) string {
	t, err := os.Readlink(filepath.Join(d, dataDirName))
	if err != nil || t == "" || strings.Contains(t, "/") {
		return ""
	}
	return t
}

// Fingerprint hashes what a consumer reading dirs sees: every visible
// (non-dot) entry, symlinks followed, files by content. Kubelet's hidden
// "..*" entries are skipped, so a swap that changes nothing visible gives
// the same fingerprint. A dangling link or an unreadable file is part of
// the fingerprint, not an error: the consumer would see it too.
func Fingerprint(dirs []string) (string, error) {
	s, err := TakeSnapshot(dirs)
	return s.Fingerprint, err
}

// hashDir writes d's visible entries to h. With target set, a key link
// "<key>" -> "..data/<key>" is read from the pinned target directory
// instead of through "..data", which a swap may move meanwhile. With keys
// set, each regular file's own SHA-256 is added to it (unless the name is
// there already).
func hashDir(h io.Writer, d, target string, keys map[string]string) error {
	ents, err := os.ReadDir(d)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	io.WriteString(h, "dir\x00"+d+"\x00")
	for _, n := range names {
		io.WriteString(h, "entry\x00"+n+"\x00")
		p := filepath.Join(d, n)
		if target != "" {
			if l, err := os.Readlink(p); err == nil && l == filepath.Join(dataDirName, n) {
				p = filepath.Join(d, target, n)
			}
		}
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			io.WriteString(h, "dangling\x00")
			continue
		case err != nil:
			io.WriteString(h, "error\x00"+err.Error()+"\x00")
			continue
		case !fi.Mode().IsRegular():
			io.WriteString(h, "mode\x00"+fi.Mode().String()+"\x00")
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			io.WriteString(h, "error\x00"+err.Error()+"\x00")
			continue
		}
		var kh hash.Hash
		w := h
		if _, dup := keys[n]; keys != nil && !dup {
			kh = sha256.New()
			w = io.MultiWriter(h, kh)
		}
		_, err = io.Copy(w, f)
		f.Close()
		if err != nil {
			return err
		}
		if kh != nil {
			keys[n] = hex.EncodeToString(kh.Sum(nil))
		}
		io.WriteString(h, "\x00end\x00")
	}
	return nil
}

// readFiles returns the visible regular files of d (links followed) by
// name: what a consumer of d reads, and what API mode takes as already
// loaded when it starts.
func readFiles(d string) (map[string][]byte, error) {
	ents, err := os.ReadDir(d)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(d, e.Name())
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		files[e.Name()] = b
	}
	return files, nil
}
