package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The stamp of the test images: a version that is not cli.Version, so the
// --version output proves the -ldflags reached the binary.
const (
	testVersion = "0.0.0-imagetest"
	testCommit  = "0123456789ab"
	testDate    = "2026-12-02T08:17:51Z"
)

// testBinaries are the binaries the test builds: readyz is the smallest,
// reload links client-go like hagate and autoconfig. Building all four
// twice for both platforms takes minutes on two cores. Under the race
// detector (make race runs ./hack/...), which slows gzip and hashing
// several times over, readyz alone: this code starts no goroutine of its
// own, the run is there for ggcr's.
var testBinaries = func() []string {
	if raceEnabled() {
		return []string{"readyz"}
	}
	return []string{"readyz", "reload"}
}()

// raceEnabled reports a test binary built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

var testPlatforms = []string{"linux/amd64", "linux/arm64"}

func testOptions(t *testing.T) Options {
	return Options{
		Out:       t.TempDir(),
		Version:   testVersion,
		Commit:    testCommit,
		Date:      testDate,
		Registry:  "ghcr.io/modelsphere",
		Platforms: testPlatforms,
		Binaries:  testBinaries,
		Log:       testLog{t},
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestImages builds the images of testBinaries for amd64 and arm64, opens
// what Build wrote (the layouts and the tarballs) and checks every image,
// then builds again and wants the same bytes.
func TestImages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	opts := testOptions(t)
	start := time.Now()
	results, err := Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %d images in %s", len(results)*len(testPlatforms), time.Since(start).Round(time.Millisecond))
	if len(results) != len(testBinaries) {
		t.Fatalf("Build returned %d results, want %d", len(results), len(testBinaries))
	}
	date, _ := time.Parse(time.RFC3339, testDate)

	ran := 0
	for i, res := range results {
		bin := testBinaries[i]
		if res.Binary != bin || res.Name != ImageName(bin) || res.Ref != "ghcr.io/modelsphere/"+ImageName(bin)+":"+testVersion {
			t.Fatalf("result %d: binary %q, name %q, ref %q", i, res.Binary, res.Name, res.Ref)
		}
		idx := openLayout(t, filepath.Join(opts.Out, res.Name), res.Index)
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var plats []string
		for _, d := range im.Manifests {
			if d.Platform == nil {
				t.Fatalf("%s: manifest %s has no platform", res.Name, d.Digest)
			}
			if d.MediaType != types.OCIManifestSchema1 {
				t.Errorf("%s %s: media type %s, want %s", res.Name, d.Platform, d.MediaType, types.OCIManifestSchema1)
			}
			plats = append(plats, d.Platform.String())
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			checkDigests(t, img, d.Digest)
			exe := checkImage(t, img, bin, *d.Platform, date)
			checkELF(t, exe, d.Platform.Architecture)
			if runtime.GOOS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				checkVersion(t, ctx, exe, bin)
				ran++
			}

			// The tarball of this platform holds the same image, tagged.
			file := filepath.Join(opts.Out, fmt.Sprintf("%s-%s-%s.tar", res.Name, testVersion, d.Platform.Architecture))
			checkTarball(t, file, res.Ref, img)
		}
		if !slices.Equal(plats, testPlatforms) {
			t.Errorf("%s: the index has platforms %q, want exactly %q", res.Name, plats, testPlatforms)
		}
	}
	if runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64") && ran != len(testBinaries) {
		t.Errorf("ran %d binaries with --version on %s/%s, want %d", ran, runtime.GOOS, runtime.GOARCH, len(testBinaries))
	}

	table, err := os.ReadFile(filepath.Join(opts.Out, "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range results {
		for _, p := range res.Platforms {
			if !bytes.Contains(table, []byte(p.Digest.String())) {
				t.Errorf("images.txt lacks %s %s %s:\n%s", res.Ref, p.Platform, p.Digest, table)
			}
		}
	}

	// Reproducible: a second build, into another directory, gives the
	// same digests and the same tarballs byte for byte.
	opts2 := testOptions(t)
	results2, err := Build(ctx, opts2)
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range results {
		res2 := results2[i]
		if res.Index != res2.Index {
			t.Errorf("%s: index digest %s, then %s: the build is not reproducible", res.Name, res.Index, res2.Index)
		}
		for j, p := range res.Platforms {
			p2 := res2.Platforms[j]
			if p.Digest != p2.Digest {
				t.Errorf("%s %s: digest %s, then %s: the build is not reproducible", res.Name, p.Platform, p.Digest, p2.Digest)
			}
			if !sameFile(t, p.Tarball, p2.Tarball) {
				t.Errorf("%s and %s differ: the tarball is not reproducible", p.Tarball, p2.Tarball)
			}
		}
	}
	if !sameFile(t, filepath.Join(opts.Out, "images.txt"), filepath.Join(opts2.Out, "images.txt")) {
		t.Errorf("images.txt differs between two builds")
	}
	t.Logf("both builds took %s", time.Since(start).Round(time.Millisecond))
}

// openLayout opens the OCI image layout at dir and returns the multi-arch
// index its index.json names, which must have digest want.
func openLayout(t *testing.T, dir string, want v1.Hash) v1.ImageIndex {
	t.Helper()
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("%s/index.json has %d entries, want 1 (the multi-arch index)", dir, len(m.Manifests))
	}
	d := m.Manifests[0]
	if d.MediaType != types.OCIImageIndex {
		t.Errorf("%s/index.json: the entry's media type is %s, want %s", dir, d.MediaType, types.OCIImageIndex)
	}
	if got := d.Annotations[refNameAnnotation]; got != testVersion {
		t.Errorf("%s/index.json: %s = %q, want %q", dir, refNameAnnotation, got, testVersion)
	}
	if d.Digest != want {
		t.Errorf("%s/index.json names %s, Build reported %s", dir, d.Digest, want)
	}
	idx, err := top.ImageIndex(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// checkDigests recomputes the digests of the image's blobs as read back:
// the manifest, the config, the layer (compressed, and its diff ID).
func checkDigests(t *testing.T, img v1.Image, want v1.Hash) {
	t.Helper()
	sum := func(r io.Reader) v1.Hash {
		h, _, err := v1.SHA256(r)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(bytes.NewReader(raw)); got != want {
		t.Errorf("manifest %s hashes to %s", want, got)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(bytes.NewReader(rawCfg)); got != m.Config.Digest {
		t.Errorf("manifest %s: config %s hashes to %s", want, m.Config.Digest, got)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 1 || len(cf.RootFS.DiffIDs) != 1 {
		t.Fatalf("manifest %s: %d layers, %d diff IDs; want 1", want, len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	if m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("manifest %s: layer media type %s, want %s", want, m.Layers[0].MediaType, types.OCILayer)
	}
	layer, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	for _, blob := range []struct {
		open func() (io.ReadCloser, error)
		want v1.Hash
	}{{layer.Compressed, m.Layers[0].Digest}, {layer.Uncompressed, cf.RootFS.DiffIDs[0]}} {
		rc, err := blob.open()
		if err != nil {
			t.Fatal(err)
		}
		got := sum(rc)
		rc.Close()
		if got != blob.want {
			t.Errorf("manifest %s: layer blob hashes to %s, want %s", want, got, blob.want)
		}
	}
}

// checkImage checks the config and the layer of bin's image for p and
// returns the binary, extracted from the layer into a temporary file.
func checkImage(t *testing.T, img v1.Image, bin string, p v1.Platform, date time.Time) string {
	t.Helper()
	where := bin + " " + p.String()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture || cf.Variant != "" {
		t.Errorf("%s: config platform %s/%s/%s", where, cf.OS, cf.Architecture, cf.Variant)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("%s: User %q, want 65532:65532", where, c.User)
	}
	if want := []string{"/usr/local/bin/" + bin}; !slices.Equal(c.Entrypoint, want) || len(c.Cmd) != 0 {
		t.Errorf("%s: Entrypoint %q Cmd %q, want %q and no Cmd", where, c.Entrypoint, c.Cmd, want)
	}
	if c.WorkingDir != "/" {
		t.Errorf("%s: WorkingDir %q", where, c.WorkingDir)
	}
	if !slices.ContainsFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		t.Errorf("%s: Env %q has no PATH", where, c.Env)
	}
	if !cf.Created.Equal(date) {
		t.Errorf("%s: created %s, want %s", where, cf.Created.Time, date)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title":    bin,
		"org.opencontainers.image.version":  testVersion,
		"org.opencontainers.image.revision": testCommit,
		"org.opencontainers.image.source":   "https://github.com/modelsphere/autoconfig",
		"org.opencontainers.image.created":  testDate,
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if got := c.Labels[k]; got != want {
			t.Errorf("%s: label %s = %q, want %q", where, k, got, want)
		}
	}
	if c.Labels["org.opencontainers.image.description"] == "" {
		t.Errorf("%s: no description label", where)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%s: %d layers, want 1", where, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	binPath := "usr/local/bin/" + bin
	var names []string
	files := map[string]*tar.Header{}
	var exe, passwd, group []byte
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: layer: %v", where, err)
		}
		names = append(names, hdr.Name)
		files[hdr.Name] = hdr
		if !hdr.ModTime.Equal(date) {
			t.Errorf("%s: %s dated %s, want %s", where, hdr.Name, hdr.ModTime, date)
		}
		var body []byte
		if hdr.Typeflag == tar.TypeReg {
			if body, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
		switch hdr.Name {
		case binPath:
			exe = body
		case "etc/passwd":
			passwd = body
		case "etc/group":
			group = body
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("%s: layer entries are not sorted: %q", where, names)
	}
	hdr := files[binPath]
	switch {
	case hdr == nil:
		t.Fatalf("%s: the layer has no %s; it has %q", where, binPath, names)
	case hdr.Typeflag != tar.TypeReg || hdr.Mode != 0o755 || hdr.Uid != 65532 || hdr.Gid != 65532:
		t.Errorf("%s: %s: type %c mode %o owner %d:%d, want a regular file 755 owned by 65532:65532", where, binPath, hdr.Typeflag, hdr.Mode, hdr.Uid, hdr.Gid)
	}
	if tmp := files["tmp/"]; tmp == nil || tmp.Typeflag != tar.TypeDir || tmp.Mode != 0o1777 {
		t.Errorf("%s: want a directory /tmp with mode 1777, got %+v", where, tmp)
	}
	if !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:[^:]*:[^:]*:[^:]*$`).Match(passwd) {
		t.Errorf("%s: /etc/passwd has no user 65532:\n%s", where, passwd)
	}
	if !regexp.MustCompile(`(?m)^nonroot:x:65532:`).Match(group) {
		t.Errorf("%s: /etc/group has no group 65532:\n%s", where, group)
	}
	file := filepath.Join(t.TempDir(), bin)
	if err := os.WriteFile(file, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	return file
}

// checkELF wants a static ELF executable for arch: the right machine, no
// program interpreter, no shared library.
func checkELF(t *testing.T, file, arch string) {
	t.Helper()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	f, err := elf.Open(file)
	if err != nil {
		t.Fatalf("%s (%s): %v", file, arch, err)
	}
	defer f.Close()
	if f.Machine != want || f.Class != elf.ELFCLASS64 {
		t.Errorf("%s: ELF machine %s class %s, want %s for %s", file, f.Machine, f.Class, want, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s (%s): has a %s program header: not static", file, arch, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s (%s): links %q: not static", file, arch, libs)
	}
}

// checkVersion runs the binary with --version and wants the stamp.
func checkVersion(t *testing.T, ctx context.Context, file, bin string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, file, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	want := fmt.Sprintf("%s %s (commit %s, built %s)\n", bin, testVersion, testCommit, testDate)
	if string(out) != want {
		t.Errorf("%s --version printed %q, want %q", bin, out, want)
	}
}

// checkTarball opens the docker/podman load tarball and wants one image,
// tagged ref, with the config and the layers of the layout's image want.
// The manifest digest differs: the docker tarball format stores no
// manifest, so a reader rebuilds one with Docker media types.
func checkTarball(t *testing.T, file, ref string, want v1.Image) {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{ref}) {
		t.Errorf("%s: manifest.json %+v, want one image tagged %s", file, m, ref)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	blobs := func(img v1.Image) []v1.Hash {
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		hs := []v1.Hash{m.Config.Digest}
		for _, l := range m.Layers {
			hs = append(hs, l.Digest)
		}
		return hs
	}
	if got, want := blobs(img), blobs(want); !slices.Equal(got, want) {
		t.Errorf("%s: config and layers %s, the layout's are %s", file, got, want)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.OS != "linux" {
		t.Errorf("%s: config %+v", file, cf)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

// TestLayerDependsOnItsInputs: the layer digest is a function of the
// binary and the date, so equal digests in TestImages mean something.
func TestLayerDependsOnItsInputs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, []byte("binary one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("binary two"), 0o644); err != nil {
		t.Fatal(err)
	}
	d1 := time.Date(2026, 12, 2, 8, 17, 51, 0, time.UTC)
	d2 := d1.Add(time.Second)
	digest := func(exe string, date time.Time) v1.Hash {
		l, err := Layer(exe, "readyz", date)
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if digest(a, d1) != digest(a, d1) {
		t.Error("the same binary and date give two layer digests")
	}
	if digest(a, d1) == digest(b, d1) {
		t.Error("two binaries give the same layer digest")
	}
	if digest(a, d1) == digest(a, d2) {
		t.Error("two dates give the same layer digest")
	}
}

// TestLDFlagsMatchMakefile: the images' binaries carry make build's stamp.
func TestLDFlagsMatchMakefile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile has no LDFLAGS line")
	}
	want := strings.NewReplacer("$(VERSION)", "V", "$(COMMIT)", "C", "$(BUILD_DATE)", "D").Replace(strings.TrimSpace(string(m[1])))
	if got := LDFlags("V", "C", "D"); got != want {
		t.Errorf("LDFlags = %q\nMakefile LDFLAGS = %q", got, want)
	}
}

// TestCheckRefusesBadInput: Build says what is wrong before building.
func TestCheckRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"date", func(o *Options) { o.Date = "2026-12-02 08:17" }, "-date"},
		{"binary", func(o *Options) { o.Binaries = []string{"readyz", "kubectl"} }, `unknown binary "kubectl"`},
		{"platform", func(o *Options) { o.Platforms = []string{"linux/arm/v7"} }, "variants are not supported"},
		{"os", func(o *Options) { o.Platforms = []string{"darwin/arm64"} }, "linux only"},
		{"repeated", func(o *Options) { o.Platforms = []string{"linux/amd64", "linux/amd64"} }, "repeated"},
		{"version", func(o *Options) { o.Version = "" }, "-version is required"},
		{"tag", func(o *Options) { o.Version = "1.0+build" }, "image reference"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			opts.Go = "/nonexistent/go" // nothing may get as far as building
			tc.change(&opts)
			_, err := Build(context.Background(), opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
