package readiness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// writeBigTables writes a tcp table of n rows in the kernel's layout (a few
// listeners first, as the kernel lists them, then established rows) and a
// small tcp6, and returns the proc root.
func writeBigTables(tb testing.TB, n int) string {
	tb.Helper()
	root := tb.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(root, "net", "tcp"))
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "%-149s\n", "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode")
	for i := range n {
		var row string
		if i < 8 {
			row = fmt.Sprintf("%4d: 00000000:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %d 1 %016x 100 0 0 10 0",
				i, 8000+i, 10000+i, 0xffff8880_00000000+uint64(i)*64)
		} else {
			row = fmt.Sprintf("%4d: 0500F40A:%04X %08X:1F90 01 00000000:00000000 02:000003C2 00000000  1000        0 %d 2 %016x 20 4 1 10 -1",
				i, 1024+i%60000, 0x0A000000+i, 10000+i, 0xffff8880_00000000+uint64(i)*64)
		}
		fmt.Fprintf(w, "%-149s\n", row)
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	f.Close()
	tcp6 := "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 9141 1 00000000301f6868 100 0 0 10 0\n"
	if err := os.WriteFile(filepath.Join(root, "net", "tcp6"), []byte(tcp6), 0o644); err != nil {
		tb.Fatal(err)
	}
	return root
}

// BenchmarkScan measures one uncached scan of both tables. "missing" is
// the worst case (the port is not there, so every row is read); "present"
// finds the port among the first rows and stops reading tcp early.
func BenchmarkScan(b *testing.B) {
	for _, rows := range []int{1_000, 10_000, 100_000} {
		root := writeBigTables(b, rows)
		for _, tc := range []struct {
			name string
			port int
		}{{"missing", 15008}, {"present", 8003}} {
			b.Run(fmt.Sprintf("rows=%d/%s", rows, tc.name), func(b *testing.B) {
				d, err := NewDetector(Options{ProcRoot: root, Ports: []int{tc.port}, Logger: (&logSink{}).logger()})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if sr := d.scan(); len(sr.errs) != 0 {
						b.Fatal(sr.errs)
					}
				}
			})
		}
	}
}

// BenchmarkCheckCached is the cost of a /readyz answered from the cache.
func BenchmarkCheckCached(b *testing.B) {
	root := writeBigTables(b, 1_000)
	d, err := NewDetector(Options{ProcRoot: root, Ports: []int{15008}, TTL: 1 << 62, Logger: (&logSink{}).logger()})
	if err != nil {
		b.Fatal(err)
	}
	d.Check(context.Background())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d.Check(context.Background())
		}
	})
}
