package procmem

import (
	"os"
	"testing"
)

func TestReadOwnProcess(t *testing.T) {
	rss, hwm, err := Read(os.Getpid())
	if err != nil || rss <= 0 || hwm < rss {
		t.Fatalf("Read: rss %d hwm %d err %v", rss, hwm, err)
	}
	anon, file, err := Split(os.Getpid())
	if err != nil || anon <= 0 || file <= 0 || anon+file > hwm+1024 {
		t.Fatalf("Split: anon %d file %d (hwm %d) err %v", anon, file, hwm, err)
	}
	if _, _, err := Read(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
