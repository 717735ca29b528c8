//go:build !unix

package readiness

import "os"

// openFlags: there is no procfs off unix; the package still builds (and
// fails open) there.
const openFlags = os.O_RDONLY
