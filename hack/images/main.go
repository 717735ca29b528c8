// Command images builds the OCI images of the four binaries (autoconfig,
// reload, hagate, readyz) without a container engine: it cross-compiles
// each binary the way make build does (CGO_ENABLED=0, -trimpath, the same
// -ldflags stamp) and assembles the images with go-containerregistry on an
// empty base. make images runs it:
//
//	go run ./hack/images -out out/images -version 0.1.0 -commit 1a2b3c4d5e6f -date 2026-12-02T08:17:51Z \
//	    [-registry ghcr.io/modelsphere] [-platforms linux/amd64,linux/arm64] \
//	    [-binaries autoconfig,reload,hagate,readyz] [-go go]
//
// Every image has one layer: the binary at /usr/local/bin/<binary> (0755,
// owned by 65532:65532), /etc/passwd and /etc/group naming root and the
// nonroot user 65532, its home /home/nonroot, and /tmp (1777). The config
// runs the binary as 65532:65532 with WorkingDir / and carries the OCI
// labels org.opencontainers.image.{title,version,revision,source,created,
// licenses,description}. There are no CA certificates: the binaries talk
// to the Kubernetes API server only, whose CA comes with the service
// account.
//
// Output under -out, for each image name (autoconfig, autoconfig-reload,
// autoconfig-hagate, autoconfig-readyz):
//
//	<name>/                       OCI image layout; index.json holds one entry, the
//	                              multi-arch index (one manifest per platform),
//	                              annotated org.opencontainers.image.ref.name=<version>
//	<name>-<version>-<arch>.tar   docker/podman load tarball of one platform,
//	                              tagged <registry>/<name>:<version>
//	images.txt                    the table printed at the end: reference,
//	                              platform, digest, compressed size, file
//
// The digests are those of the OCI manifests (one per platform) and of the
// multi-arch index in the layout: what pushing the layout publishes. A
// docker load tarball stores the config and the layer but no manifest, so
// pushing a tarball publishes a manifest rebuilt with Docker media types,
// under another digest; docker load's image ID is the config's digest
// either way.
//
// Push and load (crane is go-containerregistry's CLI:
// go install github.com/google/go-containerregistry/cmd/crane@v0.22.1):
//
//	crane push out/images/autoconfig-readyz ghcr.io/modelsphere/autoconfig-readyz:0.1.0
//	    the multi-arch index from the layout (both platforms under one tag)
//	crane push out/images/autoconfig-readyz-0.1.0-amd64.tar ghcr.io/modelsphere/autoconfig-readyz:0.1.0-amd64
//	    one platform from its tarball
//	skopeo copy --all oci:out/images/autoconfig-readyz:0.1.0 docker://ghcr.io/modelsphere/autoconfig-readyz:0.1.0
//	    the same with skopeo (oci:DIR:REF selects the ref.name annotation)
//	docker load -i out/images/autoconfig-readyz-0.1.0-amd64.tar
//	podman load -i out/images/autoconfig-readyz-0.1.0-amd64.tar
//	    both tag the image ghcr.io/modelsphere/autoconfig-readyz:0.1.0
//
// The build is reproducible: the same sources, flags (-version, -commit,
// -date, -platforms) and Go toolchain give the same digests and files
// (-registry changes only the tarballs' tag).
// Every timestamp (the layer's file times, the config's created, the
// history) is -date, the tar entries are sorted, the layer is gzipped here
// with the standard library and no header time, and the binaries are built
// with -buildvcs=false: the commit is stamped through -ldflags already, and
// the VCS stamp would change the binary (vcs.modified) whenever any file in
// the working tree is modified or untracked. GOAMD64=v1 and GOARM64=v8.0
// are pinned so an image runs on every node of its architecture whatever
// the environment says. make images passes the commit's own date, so one
// commit always gives the same images.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	module = "github.com/modelsphere/autoconfig"
	source = "https://" + module

	// UID and GID of the nonroot user, as in distroless's :nonroot images.
	nonrootID = 65532
	user      = "65532:65532"
	envPath   = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	license   = "Apache-2.0"

	// refNameAnnotation names the tag of an index.json entry (OCI image layout).
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// binaries are the buildable binaries (./cmd/<name>) and their image
// descriptions.
var binaries = map[string]string{
	"autoconfig": "ModelRoute control plane: the autoconfig CLI (vet, compile, diff, crd) and the in-cluster controller",
	"reload":     "reload sidecar: watches the mounted route ConfigMap and reloads the consumer on a settled change",
	"hagate":     "hagate sidecar: keeps one replica of a stateful router active by leader election on a Lease and a pod label",
	"readyz":     "readyz sidecar: answers GET /readyz with 503 while a required local TCP port has no listener",
}

// defaultBinaries is the -binaries default, in the order of the table.
var defaultBinaries = []string{"autoconfig", "reload", "hagate", "readyz"}

// ImageName is the repository name of a binary's image: autoconfig for the
// CLI, autoconfig-<binary> for the sidecars.
func ImageName(binary string) string {
	if binary == "autoconfig" {
		return "autoconfig"
	}
	return "autoconfig-" + binary
}

// LDFlags is make build's -ldflags (the Makefile's LDFLAGS): strip the
// symbol table and DWARF, stamp version, commit and build date.
func LDFlags(version, commit, date string) string {
	return "-s -w" +
		" -X " + module + "/internal/cli.Version=" + version +
		" -X " + module + "/internal/cli.Commit=" + commit +
		" -X " + module + "/internal/cli.BuildDate=" + date
}

// Options are the inputs of Build.
type Options struct {
	Out      string // output directory, created when missing
	Version  string // image tag and the binaries' stamped version
	Commit   string
	Date     string // RFC 3339, UTC (make's BUILD_DATE); every timestamp of the images
	Registry string // reference prefix, e.g. ghcr.io/modelsphere

	Platforms []string // "os/arch", e.g. linux/amd64
	Binaries  []string // names under ./cmd

	Go  string    // the go command; "" is go
	Log io.Writer // progress lines; nil discards them
}

// Platform is one platform's image of a binary.
type Platform struct {
	Platform v1.Platform
	Digest   v1.Hash // manifest digest, the same in the layout and the tarball
	Size     int64   // compressed size: the layers' blobs
	Tarball  string  // path of the docker/podman load tarball
}

// Result is a binary's images.
type Result struct {
	Binary    string
	Name      string // repository name, e.g. autoconfig-readyz
	Ref       string // <registry>/<name>:<version>
	Index     v1.Hash
	Layout    string // path of the OCI image layout
	Platforms []Platform
}

// Build builds the images of every binary for every platform into
// opts.Out and returns what it wrote, in the order of opts.Binaries and
// opts.Platforms.
func Build(ctx context.Context, opts Options) ([]Result, error) {
	date, plats, err := check(&opts)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, err
	}
	binDir, err := os.MkdirTemp("", "images-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)

	ldflags := LDFlags(opts.Version, opts.Commit, opts.Date)
	var results []Result
	for _, bin := range opts.Binaries {
		res := Result{Binary: bin, Name: ImageName(bin)}
		res.Ref = strings.TrimSuffix(opts.Registry, "/") + "/" + res.Name + ":" + opts.Version
		tag, err := name.NewTag(res.Ref, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("image reference %q: %w", res.Ref, err)
		}
		meta := labels(bin, opts, date)
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		var adds []mutate.IndexAddendum
		for _, p := range plats {
			logf(opts.Log, "building %s for %s", bin, p)
			exe := filepath.Join(binDir, p.OS+"-"+p.Architecture, bin)
			if err := GoBuild(ctx, opts.Go, bin, p, ldflags, exe); err != nil {
				return nil, err
			}
			img, err := Image(exe, bin, p, meta, date)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", bin, p, err)
			}
			digest, err := img.Digest()
			if err != nil {
				return nil, err
			}
			size, err := compressedSize(img)
			if err != nil {
				return nil, err
			}
			file := filepath.Join(opts.Out, fmt.Sprintf("%s-%s-%s.tar", res.Name, opts.Version, p.Architecture))
			if err := writeTarball(file, tag, img); err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture}}})
			res.Platforms = append(res.Platforms, Platform{Platform: p, Digest: digest, Size: size, Tarball: file})
		}
		idx = mutate.AppendManifests(idx, adds...)
		idx = mutate.Annotations(idx, meta).(v1.ImageIndex)
		if res.Index, err = idx.Digest(); err != nil {
			return nil, err
		}
		res.Layout = filepath.Join(opts.Out, res.Name)
		if err := writeLayout(res.Layout, idx, opts.Version); err != nil {
			return nil, fmt.Errorf("%s: %w", res.Layout, err)
		}
		results = append(results, res)
	}
	var table bytes.Buffer
	if err := WriteTable(&table, opts.Out, results); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(opts.Out, "images.txt"), table.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return results, nil
}

// check validates and completes opts; it returns the parsed date and
// platforms.
func check(opts *Options) (time.Time, []v1.Platform, error) {
	var errs []error
	if opts.Out == "" {
		errs = append(errs, errors.New("-out is required"))
	}
	if opts.Version == "" {
		errs = append(errs, errors.New("-version is required"))
	}
	if opts.Commit == "" {
		errs = append(errs, errors.New("-commit is required"))
	}
	if strings.ContainsAny(opts.Version+opts.Commit+opts.Date, " \t\n'\"") {
		errs = append(errs, errors.New("-version, -commit and -date must not contain spaces or quotes (they go into -ldflags)"))
	}
	date, err := time.Parse(time.RFC3339, opts.Date)
	if err != nil {
		errs = append(errs, fmt.Errorf("-date %q: want RFC 3339, e.g. 2026-12-02T08:17:51Z: %w", opts.Date, err))
	}
	date = date.UTC()
	if opts.Registry == "" {
		errs = append(errs, errors.New("-registry is required"))
	}
	if len(opts.Binaries) == 0 {
		errs = append(errs, errors.New("-binaries is empty"))
	}
	seen := map[string]bool{}
	for _, b := range opts.Binaries {
		if _, ok := binaries[b]; !ok {
			errs = append(errs, fmt.Errorf("unknown binary %q (known: %s)", b, strings.Join(defaultBinaries, ", ")))
		}
		if seen[b] {
			errs = append(errs, fmt.Errorf("binary %q given twice", b))
		}
		seen[b] = true
	}
	if len(opts.Platforms) == 0 {
		errs = append(errs, errors.New("-platforms is empty"))
	}
	var plats []v1.Platform
	arches := map[string]bool{}
	for _, s := range opts.Platforms {
		goos, arch, ok := strings.Cut(s, "/")
		switch {
		case !ok || strings.Contains(arch, "/"):
			errs = append(errs, fmt.Errorf("platform %q: want os/arch (variants are not supported), e.g. linux/arm64", s))
		case goos != "linux":
			errs = append(errs, fmt.Errorf("platform %q: images are linux only", s))
		case arch == "" || arches[arch]:
			errs = append(errs, fmt.Errorf("platform %q: empty or repeated architecture", s))
		default:
			arches[arch] = true
			plats = append(plats, v1.Platform{OS: goos, Architecture: arch})
		}
	}
	if opts.Go == "" {
		opts.Go = "go"
	}
	return date, plats, errors.Join(errs...)
}

// GoBuild cross-compiles ./cmd/<binary> for p into out the way make build
// does (see the package comment for -buildvcs=false and GOAMD64/GOARM64).
func GoBuild(ctx context.Context, goCmd, binary string, p v1.Platform, ldflags, out string) error {
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, module+"/cmd/"+binary)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOAMD64=v1", "GOARM64=v8.0")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s: %w\n%s", binary, p, err, stderr.Bytes())
	}
	return nil
}

// labels are the image config's labels, also the index's annotations.
func labels(binary string, opts Options, date time.Time) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       binary,
		"org.opencontainers.image.description": binaries[binary],
		"org.opencontainers.image.version":     opts.Version,
		"org.opencontainers.image.revision":    opts.Commit,
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.created":     date.Format(time.RFC3339),
		"org.opencontainers.image.licenses":    license,
	}
}

// Image assembles the image of one binary for one platform from the
// executable exe, with the given labels; date is every timestamp.
func Image(exe, binary string, p v1.Platform, labels map[string]string, date time.Time) (v1.Image, error) {
	layer, err := Layer(exe, binary, date)
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Created:      v1.Time{Time: date},
		Config: v1.Config{
			User:       user,
			Entrypoint: []string{"/usr/local/bin/" + binary},
			WorkingDir: "/",
			Env:        []string{envPath},
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: date},
			CreatedBy: "hack/images: /usr/local/bin/" + binary + ", /etc/passwd, /etc/group, /home/nonroot, /tmp",
		},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return img, nil
}

// entry is one file or directory of the layer.
type entry struct {
	name string // in the tar: no leading slash, directories end in /
	mode int64  // permission bits, with the sticky bit 01000
	id   int    // owner UID and GID
	body []byte // nil for a directory
}

// rootfs are the layer's files besides the binary.
var rootfs = []entry{
	{name: "etc/", mode: 0o755},
	{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnonroot:x:65532:\n")},
	{name: "home/", mode: 0o755},
	{name: "home/nonroot/", mode: 0o700, id: nonrootID},
	{name: "tmp/", mode: 0o1777},
	{name: "usr/", mode: 0o755},
	{name: "usr/local/", mode: 0o755},
	{name: "usr/local/bin/", mode: 0o755},
}

// Layer is the image's one layer: rootfs and the executable exe at
// /usr/local/bin/<binary>, as a gzipped tar with sorted entries all dated
// mtime. It is built in memory (a binary is tens of MB).
func Layer(exe, binary string, mtime time.Time) (v1.Layer, error) {
	body, err := os.ReadFile(exe)
	if err != nil {
		return nil, err
	}
	entries := append(slices.Clone(rootfs), entry{name: "usr/local/bin/" + binary, mode: 0o755, id: nonrootID, body: body})
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })

	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression) // no name, no ModTime: reproducible
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.id,
			Gid:     e.id,
			Uname:   "root",
			Gname:   "root",
			ModTime: mtime.Truncate(time.Second),
			Format:  tar.FormatUSTAR,
		}
		if e.id == nonrootID {
			hdr.Uname, hdr.Gname = "nonroot", "nonroot"
		}
		if e.body == nil {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	blob := gz.Bytes()
	// A gzip stream is taken as the compressed blob as it is.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(blob)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// compressedSize is the sum of the image's layer blobs.
func compressedSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	return n, nil
}

// writeTarball writes the docker/podman load tarball of img, tagged tag,
// to file (through a temporary file, so a failed run leaves none).
func writeTarball(file string, tag name.Tag, img v1.Image) error {
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// writeLayout writes dir as an OCI image layout whose index.json has one
// entry, idx, annotated with its tag. An existing layout at dir is
// replaced; any other existing non-empty directory is an error.
func writeLayout(dir string, idx v1.ImageIndex, tag string) error {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return errors.New("exists and is not an OCI image layout; not replacing it")
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	top := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        idx,
		Descriptor: v1.Descriptor{Annotations: map[string]string{refNameAnnotation: tag}},
	})
	_, err := layout.Write(dir, top)
	return err
}

// WriteTable writes one line per image and platform, and one per
// multi-arch index: reference, platform, digest, compressed size, file
// (relative to out).
func WriteTable(w io.Writer, out string, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REFERENCE\tPLATFORM\tDIGEST\tCOMPRESSED\tFILE")
	rel := func(p string) string {
		if r, err := filepath.Rel(out, p); err == nil {
			return filepath.ToSlash(r)
		}
		return p
	}
	for _, r := range results {
		var total int64
		for _, p := range r.Platforms {
			total += p.Size
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Ref, p.Platform.String(), p.Digest, size(p.Size), rel(p.Tarball))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Ref, "index", r.Index, size(total), path.Clean(rel(r.Layout))+"/")
	}
	return tw.Flush()
}

func size(n int64) string {
	return fmt.Sprintf("%.1f MiB (%d B)", float64(n)/(1<<20), n)
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func main() {
	var opts Options
	var platforms, bins string
	flag.StringVar(&opts.Out, "out", "", "output directory (created when missing)")
	flag.StringVar(&opts.Version, "version", "", "version: the image tag and the binaries' stamp")
	flag.StringVar(&opts.Commit, "commit", "", "commit stamped into the binaries and the revision label")
	flag.StringVar(&opts.Date, "date", "", "build date, RFC 3339 (make's BUILD_DATE): every timestamp of the images")
	flag.StringVar(&opts.Registry, "registry", "ghcr.io/modelsphere", "registry and namespace of the image references")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated os/arch list")
	flag.StringVar(&bins, "binaries", strings.Join(defaultBinaries, ","), "comma-separated binaries under ./cmd")
	flag.StringVar(&opts.Go, "go", "go", "the go command")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./hack/images -out DIR -version V -commit C -date D [flags]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	opts.Platforms, opts.Binaries = splitList(platforms), splitList(bins)
	opts.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := Build(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		stop()
		os.Exit(1)
	}
	if err := WriteTable(os.Stdout, opts.Out, results); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}
