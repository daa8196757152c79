//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/etcdsync/etcdsync/admin"
	"github.com/stretchr/testify/assert"
)

// TestStatusTextEscapesControlCharacters: a name, key or owner with a newline, a tab or
// bytes that are not UTF-8 shows quoted with Go's escapes, so the text table keeps one line
// per admin.Entry; a plain name shows as it is.
func TestStatusTextEscapesControlCharacters(t *testing.T) {
	var b strings.Builder
	writeName(&b, admin.NameStatus{
		Name: "jobs\nEVIL: lock, 9 holding", Primitive: "lock",
		Queue: []admin.Entry{{Position: 1, Kind: "lock", State: admin.StateHolds, Key: "jobs\nEVIL/1a_0", Token: 7,
			Owner: map[string]string{"host": "web\t3"}}},
	})
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	assert.Len(t, lines, 3, "a title, a header and one row:\n%s", b.String())
	assert.True(t, strings.HasPrefix(lines[0], `"jobs\nEVIL: lock, 9 holding": lock, 1 holding, 0 waiting`), lines[0])
	assert.Contains(t, lines[2], `"jobs\nEVIL/1a_0"`)
	assert.Contains(t, lines[2], `"web\t3"`)

	assert.Equal(t, "nightly-report", printable("nightly-report"))
	assert.Equal(t, "überweisung/ä", printable("überweisung/ä"))
	assert.Equal(t, `"a\xffb"`, printable("a\xffb"))
}
