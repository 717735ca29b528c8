package reload

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// WriteAtomic makes dir show exactly files (key → content) the way kubelet
// shows a ConfigMap volume, so a reader (nginx including "*.conf") never
// sees a half-written state:
//
//  1. the files are written into a new timestamped directory "..<time>.<rand>";
//  2. a symlink "..data_tmp" to it is renamed over "..data" (the atomic step);
//  3. each key gets a symlink "<key>" -> "..data/<key>" (created once, it
//     stays valid across swaps); links of keys that disappeared are removed;
//  4. the previous timestamped directory is removed.
//
// It returns false without writing content when it is unchanged (missing
// key links are still created).
func WriteAtomic(dir string, files map[string][]byte, now time.Time) (bool, error) {
	for k := range files {
		if err := validKey(k); err != nil {
			return false, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	dataLink := filepath.Join(dir, dataDirName)
	oldTs, err := os.Readlink(dataLink)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if oldTs != "" && sameContent(filepath.Join(dir, oldTs), files) {
		// The links are fixed even so: a write that failed after the swap
		// (a key's path blocked) is completed by the retry.
		return false, linkKeys(dir, files)
	}

	tsDir, err := os.MkdirTemp(dir, ".."+now.UTC().Format(timestampDirFn))
	if err != nil {
		return false, err
	}
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return false, err
	}
	for _, k := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(tsDir, k), files[k], 0o644); err != nil {
			os.RemoveAll(tsDir)
			return false, err
		}
	}

	tmpLink := filepath.Join(dir, dataTmpName)
	os.Remove(tmpLink) // a leftover of an interrupted swap
	if err := os.Symlink(filepath.Base(tsDir), tmpLink); err != nil {
		os.RemoveAll(tsDir)
		return false, err
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		os.Remove(tmpLink)
		os.RemoveAll(tsDir)
		return false, err
	}

	if err := linkKeys(dir, files); err != nil {
		return true, err
	}
	if oldTs != "" && oldTs != filepath.Base(tsDir) {
		if err := os.RemoveAll(filepath.Join(dir, oldTs)); err != nil {
			return true, err
		}
	}
	return true, nil
}

func validKey(k string) error {
	if k == "" || k == "." || k == ".." || strings.HasPrefix(k, "..") || strings.ContainsAny(k, "/\x00") {
		return fmt.Errorf("invalid key %q: keys are file names and cannot start with \"..\"", k)
	}
	return nil
}

func sameContent(tsDir string, files map[string][]byte) bool {
	ents, err := os.ReadDir(tsDir)
	if err != nil || len(ents) != len(files) {
		return false
	}
	for _, e := range ents {
		want, ok := files[e.Name()]
		if !ok {
			return false
		}
		got, err := os.ReadFile(filepath.Join(tsDir, e.Name()))
		if err != nil || !bytes.Equal(got, want) {
			return false
		}
	}
	return true
}

// linkKeys creates the "<key>" -> "..data/<key>" links and removes links
// into "..data" whose key is gone. Other entries are left alone.
func linkKeys(dir string, files map[string][]byte) error {
	for _, k := range slices.Sorted(maps.Keys(files)) {
		p := filepath.Join(dir, k)
		want := filepath.Join(dataDirName, k)
		if got, err := os.Readlink(p); err == nil && got == want {
			continue
		}
		tmp := filepath.Join(dir, ".."+k+".tmp")
		os.Remove(tmp)
		if err := os.Symlink(want, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if _, ok := files[e.Name()]; ok {
			continue
		}
		if got, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && got == filepath.Join(dataDirName, e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
