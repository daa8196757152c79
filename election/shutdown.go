package election

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
)

// Shutdown revokes the leases that the primitives of every etcdsync package share on cli
// (one per TTL in use), for a process about to exit: every hold and waiting acquisition on
// them ends at once (Done closes, Err returns [ErrLost]) and their keys go, so other
// processes need not wait a TTL; without it, a closed client's keys go when its lease
// expires. An acquisition after Shutdown grants a new lease. Sessions given with
// [WithSession] are the caller's to close. A nil cli returns [ErrInvalidOption].
func Shutdown(ctx context.Context, cli *clientv3.Client) error {
	if cli == nil {
		return fmt.Errorf("election: shutdown: %w: nil client", ErrInvalidOption)
	}
	return core.Shutdown(ctx, cli)
}
