//go:build race

package main

// Under `go test -race` the hagate binary is built with -race too, so the
// end-to-end tests check the gate's goroutines (elector, label loop).
var buildFlags = []string{"-race"}
