package reload

// TestHooks let a test outside this package (cmd/reload's race test) steer
// and watch a Reloader it runs in its own process. The binary never sets
// them; this package's own tests set the Reloader's private seams
// directly.
type TestHooks struct {
	// Signaller, if set, replaces kill(2).
	Signaller Signaller
	// OnReload, if set, is called after every reload attempt.
	OnReload func(Outcome)
	// OnVerified, if set, is called with the content id (ContentID) the
	// Reloader found in place at its last look before a signal.
	OnVerified func(contentID string)
}

// SetTestHooks installs h; call it before Run. For tests only.
func (r *Reloader) SetTestHooks(h TestHooks) {
	if h.Signaller != nil {
		r.sig.kill = h.Signaller
	}
	r.sig.onReload = h.OnReload
	r.sig.onVerified = h.OnVerified
}
