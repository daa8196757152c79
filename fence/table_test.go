package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync"
	"github.com/etcdsync/etcdsync/fence"
)

// What a Check sends to a database, and what it does there, is tested on real servers by
// internal/testkit/fencetest; here, what needs none.

func TestNewTableTakesPlainIdentifiers(t *testing.T) {
	for _, name := range []string{"etcdsync_fence", "_f", "Fence2", "select", strings.Repeat("a", 63)} {
		for _, d := range []fence.Dialect{fence.Postgres, fence.MySQL, fence.SQLite} {
			table, err := fence.NewTable(d, name)
			require.NoError(t, err, "%v %q", d, name)
			assert.Equal(t, name, table.Name())
			assert.Equal(t, d, table.Dialect())
		}
	}
}

func TestNewTableDefaultsItsName(t *testing.T) {
	table, err := fence.NewTable(fence.Postgres, "")
	require.NoError(t, err)
	assert.Equal(t, fence.DefaultName, table.Name())
}

func TestNewTableRefusesWhatIsNotAPlainIdentifier(t *testing.T) {
	for _, name := range []string{
		"1fence", "fence table", "public.fence", `fe"nce`, "fe`nce", "fence;DROP TABLE x", "fence--",
		"fencé", "fence\x00", strings.Repeat("a", 64), "-fence", "fence-x",
	} {
		_, err := fence.NewTable(fence.Postgres, name)
		assert.ErrorIs(t, err, etcdsync.ErrInvalidOption, "%q", name)
	}
}

func TestNewTableRefusesAnUnknownDialect(t *testing.T) {
	for _, d := range []fence.Dialect{0, fence.SQLite + 1, -1} {
		_, err := fence.NewTable(d, "")
		assert.ErrorIs(t, err, etcdsync.ErrInvalidOption, "%v", d)
	}
}

func TestDialectNames(t *testing.T) {
	assert.Equal(t, "postgres", fence.Postgres.String())
	assert.Equal(t, "mysql", fence.MySQL.String())
	assert.Equal(t, "sqlite", fence.SQLite.String())
	assert.Equal(t, "Dialect(9)", fence.Dialect(9).String())
}

func TestErrorsAreEtcdsyncs(t *testing.T) {
	assert.Equal(t, etcdsync.ErrInvalidOption, fence.ErrInvalidOption)
	assert.Equal(t, etcdsync.ErrLost, fence.ErrLost)
}

func TestErrStaleIsALoss(t *testing.T) {
	assert.ErrorIs(t, fence.ErrStale, etcdsync.ErrLost)
	wrapped := errors.Join(errors.New("context"), fence.ErrStale)
	assert.ErrorIs(t, wrapped, fence.ErrStale)
	assert.ErrorIs(t, wrapped, etcdsync.ErrLost)
	assert.NotErrorIs(t, etcdsync.ErrLost, fence.ErrStale)
}

// A Table that NewTable did not make, and a nil tx or db, are refused before any SQL: the nil
// *sql.DB and *sql.Tx would panic if anything were sent through them.
func TestUnmadeTableAndNilHandlesSendNothing(t *testing.T) {
	ctx := context.Background()
	for name, table := range map[string]*fence.Table{"zero": {}, "nil": nil} {
		assert.ErrorIs(t, table.Create(ctx, nil), etcdsync.ErrInvalidOption, name)
		assert.ErrorIs(t, table.Check(ctx, nil, "r", 1), etcdsync.ErrInvalidOption, name)
		assert.Empty(t, table.Name(), name)
		assert.Zero(t, table.Dialect(), name)
	}
	table, err := fence.NewTable(fence.SQLite, "")
	require.NoError(t, err)
	assert.ErrorIs(t, table.Create(ctx, nil), etcdsync.ErrInvalidOption)
	assert.ErrorIs(t, table.Check(ctx, nil, "r", 1), etcdsync.ErrInvalidOption)
}
