package trylock

import (
	"errors"
	"fmt"
	"time"

	"github.com/etcdsync/etcdsync/internal/core"
)

// The backoff of Retry without the Backoff option, and of Timeout.
const (
	DefaultInitialBackoff = 100 * time.Millisecond
	DefaultMaxBackoff     = 2 * time.Second
)

// A RetryOption configures Retry.
type RetryOption func(*retryConfig)

type retryConfig struct {
	attempts     int // 0: until ctx ends
	initial, max time.Duration
	errs         []error
}

// Attempts makes [Retry] give up after n tries in all (the first one included), n >= 1;
// without it Retry tries until its ctx ends. Releases on the name cut waits short (see
// Retry), so on a busy name the n tries may come sooner than the backoff alone would space
// them.
func Attempts(n int) RetryOption {
	return func(c *retryConfig) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("%w: Attempts(%d), want at least 1", ErrInvalidOption, n))
			return
		}
		c.attempts = n
	}
}

// Backoff sets the delays between [Retry]'s tries, 0 < initial <= max: the first is
// initial, each next one twice the one before, up to max; each is then drawn at random from
// [½, 1½] of that and capped at max, so that the retries of many clients spread out. A
// release on the name may end a delay early (see Retry). Without it:
// [DefaultInitialBackoff], [DefaultMaxBackoff].
func Backoff(initial, max time.Duration) RetryOption {
	return func(c *retryConfig) {
		if initial <= 0 || initial > max {
			c.errs = append(c.errs, fmt.Errorf("%w: Backoff(%v, %v), want 0 < initial <= max", ErrInvalidOption, initial, max))
			return
		}
		c.initial, c.max = initial, max
	}
}

func defaultRetry() retryConfig {
	return retryConfig{initial: DefaultInitialBackoff, max: DefaultMaxBackoff}
}

func retryOptions(opts []RetryOption) (retryConfig, error) {
	c := defaultRetry()
	for _, opt := range opts {
		if opt == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil RetryOption", ErrInvalidOption))
			continue
		}
		opt(&c)
	}
	return c, errors.Join(c.errs...)
}

// delays is the sequence of Retry's waits: the core's backoff, with Retry's bounds.
func (c retryConfig) delays() *core.Backoff {
	return &core.Backoff{Initial: c.initial, Max: c.max}
}
