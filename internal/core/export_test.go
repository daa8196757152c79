package core

// Transient is transient, for the tests of package core_test.
var Transient = transient
