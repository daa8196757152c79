package core_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/etcdsync/etcdsync/internal/core"
)

// subranges are the key ranges a name's primitives write in, relative to its prefix: an
// exclusive lock's keys (mutex, reentrant, election) directly under it, the rwmutex's and
// the semaphore's kinds, and the semaphore's limit record (a single key).
var subranges = []struct {
	rel    string
	single bool
}{
	{"", false},
	{core.KindRead, false},
	{core.KindWrite, false},
	{core.KindPermit, false},
	{core.RecordLimit, true},
}

// overlap reports whether the key ranges (or single keys) a and b share a key.
func overlap(a string, aSingle bool, b string, bSingle bool) bool {
	switch {
	case aSingle && bSingle:
		return a == b
	case aSingle:
		return strings.HasPrefix(a, b)
	case bSingle:
		return strings.HasPrefix(b, a)
	}
	return strings.HasPrefix(a, b) || strings.HasPrefix(b, a)
}

// layout returns the key prefix of name under prefix ("" for none), or the error New would
// return for them.
func layout(prefix, name string) (string, error) {
	var opts []core.Option
	if prefix != "" {
		opts = append(opts, core.WithPrefix(prefix))
	}
	cfg, err := core.Options(opts)
	if err != nil {
		return "", err
	}
	if err := core.ValidateName(name); err != nil {
		return "", err
	}
	return cfg.KeyPrefix(name), nil
}

// validName is the contract of API.md, written independently of the core's code.
func validName(s string) bool {
	return s != "" && len(s) <= core.MaxNameLen && !strings.ContainsRune(s, 0) && utf8.ValidString(s)
}

// FuzzKeyLayout checks, for two (prefix, name) pairs, that validation follows the contract
// and that distinct names under one prefix never share a key in any primitive and kind.
// Under two prefixes, keys are shared only in the one documented case: one prefix is the
// other followed by the escaped name and a '/' ("app/" with name "x" against "app/x/").
func FuzzKeyLayout(f *testing.F) {
	seeds := [][4]string{
		{"", "a", "", "a/b"},
		{"", "a", "", "ab"},
		{"", "a/", "", "a%2F"},
		{"", "a%2Fb", "", "a/b"},
		{"", "/", "", "%"},
		{"app/", "lock", "", "app/lock"},
		{"app/", "x", "app/x/", "y"},
		{"app/", "x/y", "app/x/", "y"},
		{"app/", "read", "", "app"},
		{"app/", "a", "app/", "a/permit"},
		{"t/", "limit", "t/", "limit/"},
		{"", "a\x00", "", "a"},
		{"", "\xff", "", "é"},
		{"noslash", "a", "", "a"},
		{"/", "a", "//", "a"},
		{"", strings.Repeat("n", 513), "", strings.Repeat("n", 512)},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, p1, n1, p2, n2 string) {
		k1, err1 := layout(p1, n1)
		k2, err2 := layout(p2, n2)
		for _, c := range []struct {
			p, n, k string
			err     error
		}{{p1, n1, k1, err1}, {p2, n2, k2, err2}} {
			validPrefix := c.p == "" || (strings.HasSuffix(c.p, "/") && len(c.p) <= core.MaxNameLen &&
				!strings.ContainsRune(c.p, 0) && utf8.ValidString(c.p))
			switch {
			case !validPrefix:
				if !errors.Is(c.err, core.ErrInvalidOption) {
					t.Fatalf("prefix %q: got %v, want ErrInvalidOption", c.p, c.err)
				}
				return
			case !validName(c.n):
				if !errors.Is(c.err, core.ErrInvalidName) {
					t.Fatalf("name %q: got %v, want ErrInvalidName", c.n, c.err)
				}
				return
			case c.err != nil:
				t.Fatalf("prefix %q, name %q: %v", c.p, c.n, c.err)
			}
			if !strings.HasPrefix(c.k, c.p) {
				t.Fatalf("name %q's keys %q lie outside its prefix %q", c.n, c.k, c.p)
			}
			if !strings.ContainsAny(c.n, "/%") && c.k != c.p+c.n+"/" {
				t.Fatalf("plain name %q under %q has keys %q, not etcd's layout", c.n, c.p, c.k)
			}
		}
		if p1 == p2 && n1 == n2 {
			return
		}
		documented := nested(p1, n1, p2) || nested(p2, n2, p1)
		shared := false
		for _, a := range subranges {
			for _, b := range subranges {
				if overlap(k1+a.rel, a.single, k2+b.rel, b.single) {
					shared = true
					if !documented {
						t.Fatalf("(%q, %q) and (%q, %q) share keys: %q and %q", p1, n1, p2, n2, k1+a.rel, k2+b.rel)
					}
				}
			}
		}
		if documented && !shared {
			t.Fatalf("(%q, %q) and (%q, %q): the documented overlap is not there", p1, n1, p2, n2)
		}
	})
}

// nested reports whether prefix inner lies under the keys of name under outer.
func nested(outer, name, inner string) bool {
	return strings.HasPrefix(inner, outer+core.NamePrefix(name))
}

// FuzzNameOfKindKey checks that the name and the rest of every kind's key, as KeyPrefix
// lays it out under a prefix (escaped, and etcd's layout), are read back from the key.
func FuzzNameOfKindKey(f *testing.F) {
	for _, s := range [][2]string{
		{"", "a"}, {"app/", "jobs/nightly"}, {"", "/my-lock/"}, {"t/", "a/permit"},
		{"", "x/permit/u2"}, {"", "100%"}, {"app/", "read"},
	} {
		f.Add(s[0], s[1])
	}
	rests := []string{"694d_0", "u2/694d_3"}
	f.Fuzz(func(t *testing.T, prefix, name string) {
		if !validName(name) {
			return
		}
		for _, etcd := range []bool{false, true} {
			opts := []core.Option{}
			if prefix != "" {
				opts = append(opts, core.WithPrefix(prefix))
			}
			if etcd {
				opts = append(opts, core.WithEtcdLayout())
			}
			cfg, err := core.Options(opts)
			if err != nil {
				return // a bad prefix: FuzzKeyLayout's
			}
			for _, kind := range []string{"", core.KindRead, core.KindWrite, core.KindPermit} {
				for _, rest := range rests {
					if kind == "" && strings.Contains(rest, "/") {
						continue // an exclusive lock's keys are a lease and a slot
					}
					key := cfg.KeyPrefix(name) + kind + rest
					gotName, gotRest, ok := cfg.NameOfKindKey(key, kind)
					if !ok || gotName != name || gotRest != rest {
						t.Fatalf("etcd layout %v, prefix %q: key %q of kind %q read as (%q, %q, %v), want (%q, %q)",
							etcd, prefix, key, kind, gotName, gotRest, ok, name, rest)
					}
				}
			}
		}
	})
}

// TestParseKey: every kind's key, of one unit or several, with a slot or without (etcd's
// own), is read back; records, markers and other data are not keys.
func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		rest string
		want core.KeyShape
		ok   bool
	}{
		{"694d2a1b_0", core.KeyShape{Units: 1}, true},
		{"694d2a1b", core.KeyShape{Units: 1}, true},
		{core.KindRead + "694d_12", core.KeyShape{Kind: core.KindRead, Units: 1}, true},
		{core.KindWrite + "1732550000000000", core.KeyShape{Kind: core.KindWrite, Units: 1, Recipe: true}, true},
		{core.KindPermit + "694d_3", core.KeyShape{Kind: core.KindPermit, Units: 1}, true},
		{core.KindPermit + "u5/694d_3", core.KeyShape{Kind: core.KindPermit, Units: 5}, true},
		{core.KindParticipant + "694d_0", core.KeyShape{Kind: core.KindParticipant, Units: 1}, true},
		{core.KindPermit + "u1/694d_3", core.KeyShape{}, false},
		{core.KindPermit + "u05/694d_3", core.KeyShape{}, false},
		{core.KindPermit + "u2147483648/694d_3", core.KeyShape{}, false},
		{core.KindRead + "u5/694d_3", core.KeyShape{}, false},
		{core.RecordLimit, core.KeyShape{}, false},
		{core.LatchKey + "/p1", core.KeyShape{}, false},
		{"694d_x", core.KeyShape{}, false},
		{"694D_0", core.KeyShape{}, false},
		{"", core.KeyShape{}, false},
		{core.KindWrite, core.KeyShape{}, false},
	} {
		got, ok := core.ParseKey(c.rest)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v, %v", c.rest, got, ok, c.want, c.ok)
		}
	}
}

// TestSpecOfKey: every kind of key reads back as the spec its primitive writes it with; a
// record, a gathering's key and a permit under an unknown limit as none.
func TestSpecOfKey(t *testing.T) {
	upgradable := core.WithMode(core.OwnerValue(""), core.ModeUpgradable)
	upgrading := core.WithMode(core.OwnerValue(""), core.ModeUpgrading)
	for _, c := range []struct {
		rest, value string
		limit       int
		want        core.Spec
		ok          bool
	}{
		{"694d_0", "", 0, core.LockSpec(""), true},
		{"p3/694d_0", "", 0, core.LockSpec(""), true}, // a preferred candidate's: a lock's layout
		{core.KindRead + "694d_1", "", 0, core.ReadSpec(""), true},
		{core.KindWrite + "694d_1", "", 0, core.WriteSpec(""), true},
		{core.KindWrite + "694d_1", core.WithMode("v", core.ModeRead), 0, core.WriteSpec(""), true},
		{core.KindWrite + "694d_1", upgradable, 0, core.UpgradableSpec(""), true},
		{core.KindWrite + "694d_1", upgrading, 0, core.UpgradableSpec(""), true},
		{core.KindPermit + "694d_1", "", 3, core.PermitSpec("", 3, 1), true},
		{core.KindPermit + "u2/694d_1", "", 3, core.PermitSpec("", 3, 2), true},
		{core.KindPermit + "694d_1", "", 0, core.Spec{}, false},
		{core.RecordLimit, "3", 3, core.Spec{}, false},
		{core.LimitMark + "3", "", 3, core.Spec{}, false},
		{core.KindParticipant + "694d_0", "", 0, core.Spec{}, false},
		{core.RecordRound, "", 0, core.Spec{}, false},
		{core.GateKey, "", 0, core.Spec{}, false},
		{core.LatchKey, "", 0, core.Spec{}, false},
	} {
		got, ok := core.SpecOfKey(c.rest, c.value, c.limit)
		if ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("SpecOfKey(%q, %q, %d) = %+v, %v; want %+v, %v", c.rest, c.value, c.limit, got, ok, c.want, c.ok)
		}
	}
}
