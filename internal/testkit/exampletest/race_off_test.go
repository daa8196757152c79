//go:build !race

package exampletest

// raceDetector reports whether the tests run under the race detector.
const raceDetector = false
