//go:build unix

package readiness

import (
	"os"
	"syscall"
)

// openFlags: O_NONBLOCK keeps a fifo in a table's place from blocking the
// open (and with it every waiting caller); it has no effect on regular
// files.
const openFlags = os.O_RDONLY | syscall.O_NONBLOCK
