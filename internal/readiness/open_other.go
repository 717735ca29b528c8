//go:build !unix

package readiness

import (
	"fmt"
	"os"
)

// openTable opens path for reading and checks it is a regular file, as
// procfs tables are. There is no procfs off unix; this keeps the package
// building (and failing open) there.
func openTable(path string) (*os.File, error) {
	f, err := os.Open(path)
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
