package realbench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain stops the clusters the benchmarks started before goleak looks for goroutines left
// running. No embedded member runs here, so goleak needs no exceptions.
func TestMain(m *testing.M) { goleak.VerifyTestMain(closingM{m}) }

// closingM runs the tests and benchmarks, then closes the clusters they started.
type closingM struct{ m *testing.M }

func (c closingM) Run() int {
	defer closeClusters()
	return c.m.Run()
}
