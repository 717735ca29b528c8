package reload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readVisible(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got[e.Name()] = string(b)
	}
	return got
}

func hiddenDirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var ds []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "..") {
			ds = append(ds, e.Name())
		}
	}
	return ds
}

func TestWriteAtomic(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "routes")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	changed, err := WriteAtomic(dir, map[string][]byte{"a.conf": []byte("A1"), "b.conf": []byte("B1")}, now)
	if err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	data, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil || !strings.HasPrefix(data, "..2026_01_02_03_04_05.") {
		t.Fatalf("..data -> %q, %v; want a timestamped directory", data, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "a.conf")); err != nil || l != "..data/a.conf" {
		t.Fatalf("a.conf -> %q, %v; want ..data/a.conf", l, err)
	}
	fp1, _ := Fingerprint([]string{dir})

	// Same content: nothing is touched.
	changed, err = WriteAtomic(dir, map[string][]byte{"a.conf": []byte("A1"), "b.conf": []byte("B1")}, now)
	if err != nil || changed {
		t.Fatalf("same content: changed=%v err=%v", changed, err)
	}
	if d2, _ := os.Readlink(filepath.Join(dir, "..data")); d2 != data {
		t.Fatalf("..data moved on an unchanged write: %q -> %q", data, d2)
	}

	// A plain file of someone else is kept; b.conf disappears; c.conf appears.
	os.WriteFile(filepath.Join(dir, "local.txt"), []byte("mine"), 0o644)
	changed, err = WriteAtomic(dir, map[string][]byte{"a.conf": []byte("A2"), "c.conf": []byte("C1")}, now.Add(time.Second))
	if err != nil || !changed {
		t.Fatalf("update: changed=%v err=%v", changed, err)
	}
	want := map[string]string{"a.conf": "A2", "c.conf": "C1", "local.txt": "mine"}
	got := readVisible(t, dir)
	if len(got) != len(want) {
		t.Fatalf("visible files: got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("visible files: got %v, want %v", got, want)
		}
	}
	if ds := hiddenDirs(t, dir); len(ds) != 1 {
		t.Fatalf("old timestamped directories left: %v", ds)
	}
	if _, err := os.Lstat(filepath.Join(dir, "..data_tmp")); err == nil {
		t.Fatal("..data_tmp left behind")
	}
	if fp2, _ := Fingerprint([]string{dir}); fp2 == fp1 {
		t.Fatal("fingerprint did not change with the content")
	}

	for _, bad := range []string{"..data", "a/b", "", ".."} {
		if _, err := WriteAtomic(dir, map[string][]byte{bad: nil}, now); err == nil {
			t.Errorf("key %q accepted", bad)
		}
	}
}

func TestFingerprintIgnoresHiddenEntries(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.conf"), []byte("A"), 0o644)
	fp1, err := Fingerprint([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "..2026_01_01_00_00_00.1"), 0o755)
	if fp2, _ := Fingerprint([]string{dir}); fp2 != fp1 {
		t.Fatal("a hidden entry changed the fingerprint")
	}
	os.WriteFile(filepath.Join(dir, "a.conf"), []byte("B"), 0o644)
	if fp3, _ := Fingerprint([]string{dir}); fp3 == fp1 {
		t.Fatal("a content change kept the fingerprint")
	}
}

func TestSwapInProgress(t *testing.T) {
	dir := t.TempDir()
	if swapInProgress([]string{dir}) {
		t.Fatal("empty directory reported as mid-swap")
	}
	// Between kubelet's symlink and rename steps "..data_tmp" exists.
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if !swapInProgress([]string{t.TempDir(), dir}) {
		t.Fatal("..data_tmp not seen as a swap in progress")
	}
}
