//go:build unix

package readiness

import (
	"fmt"
	"os"
	"syscall"
)

// openTable opens path for reading and checks it is a regular file, as
// procfs tables are. O_NONBLOCK keeps a fifo in its place from blocking
// the open (and with it every waiting caller); it has no effect on regular
// files.
func openTable(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("open %s: %w (%v)", path, errNotRegular, fi.Mode().Type())
	}
	return f, nil
}
