package fence

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/fencing.md shows the statements Check runs, and a shell runs PostgreSQL's: they must
// be the ones here.
func TestTheDocsShowTheStatementsCheckRuns(t *testing.T) {
	raw, err := os.ReadFile("../docs/fencing.md")
	require.NoError(t, err)
	doc := string(raw)
	blocks := sqlBlocks(doc)
	shows := func(what, sql string) {
		t.Helper()
		assert.True(t, slices.Contains(blocks, sql), "docs/fencing.md has no sql block of %s:\n%s", what, sql)
	}
	pg := newPostgres(`"etcdsync_fence"`)
	my := newMySQL("`etcdsync_fence`")
	shows("PostgreSQL's check", pg.checkSQL)
	shows("PostgreSQL's table", pg.createSQL)
	shows("MySQL's check", my.raiseSQL+"\n"+my.readSQL)
	// The shell's: the same statement with psql's variables for its parameters.
	shell := strings.NewReplacer(`"etcdsync_fence"`, "etcdsync_fence", "$1", ":'resource'", "$2", ":'token'").
		Replace(pg.checkSQL) + ` \gset`
	assert.True(t, strings.Contains(doc, shell), "docs/fencing.md's psql has not:\n%s", shell)
	sqlite := newSQLite(`"etcdsync_fence"`)
	assert.Equal(t, strings.NewReplacer("$1", "?1", "$2", "?2", " AS f", "", "f.token", "token", "EXCLUDED", "excluded").
		Replace(pg.checkSQL), sqlite.checkSQL, "SQLite's is PostgreSQL's with ?1, ?2, as the doc says")
}

// sqlBlocks returns the contents of the doc's ```sql blocks, without their last newline.
func sqlBlocks(doc string) []string {
	var blocks []string
	for _, part := range strings.Split(doc, "```sql\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		blocks = append(blocks, strings.TrimSuffix(block, "\n"))
	}
	return blocks
}
