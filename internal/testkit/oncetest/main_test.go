package once_test

import (
	"testing"

	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

var cluster *etcdtest.Cluster

func TestMain(m *testing.M) { etcdtest.Main(m, &cluster) }
