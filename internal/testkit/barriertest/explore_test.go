package barrier_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/testkit/faulttest"
)

// TestExplore runs a double barrier and countdown latches, at once, under the explorer's
// fault schedules (see faulttest.ExploreGathering).
func TestExplore(t *testing.T) { faulttest.ExploreGathering(t) }
