package schema

// RefusedForSize reports whether src's route documents are refused by
// their counts (routeCounts, FileBounds) before the schema sees them.
func RefusedForSize(src []byte) bool { return tooMany(src) != nil }
