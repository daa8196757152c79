// Package multitest runs mutex.Multi through the fault suite and the seeded explorer of
// faulttest. It is a package of its own, rather than part of mutex's tests, only to keep
// each test binary well under go test's default 10-minute timeout, which the README's test
// command keeps: measured on 2 cores with -race on 2026-11-27, each package alone, these
// two tests took 171 s and all of mutex's 281 s; in CI, which runs two packages at once,
// packages take up to about 1.5 times as long, so that the two in one binary would come
// near the limit. The figures: docs/ci.md.
package multitest
