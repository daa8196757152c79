// Package multitest runs mutex.Multi through the fault suite and the seeded explorer of
// faulttest. They take about ten minutes on two cores, so they live in a package of their
// own rather than in mutex's tests, which go test's default timeout would then cut short.
package multitest
