//go:build unix

package realbench

import (
	"syscall"
	"time"
)

// haveProcessCPU says whether processCPU reads anything.
const haveProcessCPU = true

// processCPU is the CPU the test process has used so far, user and system, by every one of
// its goroutines (getrusage RUSAGE_SELF); 0 if it cannot be read.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
