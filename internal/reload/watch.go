package reload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
// old directory.
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

// Fingerprint hashes what a consumer reading dirs sees: every visible
// (non-dot) entry, symlinks followed, files by content. Kubelet's hidden
// "..*" entries are skipped, so a swap that changes nothing visible gives
// the same fingerprint. A dangling link or an unreadable file is part of
// the fingerprint, not an error: the consumer would see it too.
func Fingerprint(dirs []string) (string, error) {
	h := sha256.New()
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			return "", err
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
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
			io.WriteString(h, "\x00end\x00")
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
