package core

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameLen is the longest name, in bytes.
const MaxNameLen = 512

// The sub-ranges and records under a name's prefix, every one the primitives use. An
// exclusive lock's (mutex, reentrant, election) keys lie directly under the name's prefix.
const (
	KindRead    = "read/"   // rwmutex readers
	KindWrite   = "write/"  // rwmutex writers
	KindPermit  = "permit/" // semaphore permits
	RecordLimit = "limit"   // the semaphore's limit record
)

// ValidateName reports, wrapped around ErrInvalidName, why name cannot be used.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if why := invalidString(name); why != "" {
		return fmt.Errorf("%w: %s", ErrInvalidName, why)
	}
	return nil
}

// validPrefix reports, wrapped around ErrInvalidOption, why WithPrefix cannot take p.
func validPrefix(p string) error {
	if !strings.HasSuffix(p, "/") {
		return fmt.Errorf("%w: prefix %q does not end with '/'", ErrInvalidOption, p)
	}
	if why := invalidString(p); why != "" {
		return fmt.Errorf("%w: prefix %s", ErrInvalidOption, why)
	}
	return nil
}

// invalidString says why s cannot be part of a key, or "" when it can.
func invalidString(s string) string {
	switch {
	case len(s) > MaxNameLen:
		return fmt.Sprintf("%d bytes, more than %d", len(s), MaxNameLen)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Sprintf("%q holds a NUL byte", s)
	case !utf8.ValidString(s):
		return fmt.Sprintf("%q is not valid UTF-8", s)
	}
	return ""
}

// nameEscaper makes a name free of '/', so that the prefix "<escaped>/" of one name never
// holds another name's keys ("a" vs "a/b"), and keeps a name without '%' and '/' as it is,
// so that such names share the key layout of etcd's concurrency.Mutex and `etcdctl lock`.
var nameEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// NamePrefix is the key prefix that holds every key of name: the escaped name and a '/'.
func NamePrefix(name string) string { return nameEscaper.Replace(name) + "/" }
