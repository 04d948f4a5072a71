package main

import (
	"fmt"
	"runtime/debug"
)

// versionLine is the build as the Go toolchain stamped it: the module's
// version ("(devel)" in a clone), the commit and its time, whether the
// tree had changes, and the Go version.
func versionLine() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "chameleon (no build information)"
	}
	s := fmt.Sprintf("chameleon %s", bi.Main.Version)
	var rev, when, modified string
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			when = kv.Value
		case "vcs.modified":
			modified = kv.Value
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " commit " + rev
		if when != "" {
			s += " (" + when + ")"
		}
		if modified == "true" {
			s += " with uncommitted changes"
		}
	}
	return s + ", " + bi.GoVersion
}
