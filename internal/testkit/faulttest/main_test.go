package faulttest_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// cluster is the single member etcdtest.Main starts; the harness's own tests start 3.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }
