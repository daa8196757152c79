package primtest_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }
