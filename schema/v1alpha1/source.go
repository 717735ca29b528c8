package v1alpha1

import _ "embed"

// TypesSource is types.go itself: the CRD generator reads the status
// types' fields and doc comments from it (the status is written by the
// controller, so its Go types are its source of truth, unlike the spec,
// whose source is the CUE schema).
//
//go:embed types.go
var TypesSource string
