//go:build !unix

package realbench

import "time"

// haveProcessCPU says whether processCPU reads anything: not without getrusage, where no
// client CPU is reported.
const haveProcessCPU = false

func processCPU() time.Duration { return 0 }
