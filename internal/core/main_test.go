package core_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests here need no etcd; those that do are in internal/testkit/coretest.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
