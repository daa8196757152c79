//go:build unix

package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// printVersion writes `etcdsync VERSION GOVERSION OS/ARCH`: the module's version from the
// build info ("(devel)" for a build from a checkout, with its VCS revision when the build
// recorded one) and the Go version it was built with.
func printVersion(w io.Writer) {
	version, goVersion := "(devel)", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if v := bi.Main.Version; v != "" {
			version = v
		}
		if version == "(devel)" {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					version += " " + s.Value[:12]
				}
			}
		}
	}
	fmt.Fprintf(w, "etcdsync %s %s %s/%s\n", version, goVersion, runtime.GOOS, runtime.GOARCH)
}
