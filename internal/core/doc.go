// Package core is the one implementation behind every etcdsync primitive: names and
// keys, options, the shared session layer, and a wait-for-predecessor queue ordered by
// create revision whose holds report their own loss.
//
// Public packages adapt it to their vocabulary; no algorithm lives twice.
package core
