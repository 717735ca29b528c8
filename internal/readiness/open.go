package readiness

import (
	"fmt"
	"os"
)

// openTable opens path for reading and checks it is a regular file, as
// procfs tables are.
func openTable(path string) (*os.File, error) {
	f, err := os.OpenFile(path, openFlags, 0)
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
