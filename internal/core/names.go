package core

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes.
const MaxNameLen = 512

// ValidateName reports, wrapped around ErrInvalidName, why name cannot be used.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidName, len(name), MaxNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: %q holds a NUL byte", ErrInvalidName, name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	}
	return nil
}

// nameEscaper makes a name free of '/', so that the prefix "<escaped>/" of one name never
// holds another name's keys ("a" vs "a/b"), and keeps a name without '%' and '/' as it is,
// so that such names share the key layout of etcd's concurrency.Mutex and `etcdctl lock`.
var nameEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// NamePrefix is the key prefix that holds every key of name: the escaped name and a '/'.
func NamePrefix(name string) string { return nameEscaper.Replace(name) + "/" }

// InteropName reports whether name has etcd's own layout, so that etcd's concurrency.Mutex
// and `etcdctl lock` on the same name exclude an etcdsync mutex.
func InteropName(name string) bool { return !strings.ContainsAny(name, "%/") }
