package etcdtest

import (
	"fmt"
	"os"
)

// Backup copies the data directory of stopped member i (its WAL, snapshots and database) to
// a new directory and returns its path, removed when the cluster closes. It panics on an
// external cluster.
func (c *Cluster) Backup(i int) (string, error) {
	m := c.member(i)
	m.life.Lock()
	defer m.life.Unlock()
	if m.running() {
		return "", fmt.Errorf("etcdtest: backup %s: the member runs; stop it first", m.name)
	}
	dir, err := os.MkdirTemp("", "etcdtest-backup-*")
	if err != nil {
		return "", fmt.Errorf("etcdtest: backup %s: %w", m.name, err)
	}
	c.backups = append(c.backups, dir)
	if err := os.CopyFS(dir+"/data", os.DirFS(m.dir)); err != nil {
		return "", fmt.Errorf("etcdtest: backup %s: %w", m.name, err)
	}
	return dir + "/data", nil
}

// RestoreBackup replaces the data directory of stopped member i with the backup Backup
// made: once restarted, the member has the history it had then, as after an operator
// restored it from an older backup. Revisions go back, keys written since are gone without a
// delete event, keys deleted since are back, on their leases if those were alive then.
func (c *Cluster) RestoreBackup(i int, backup string) error {
	m := c.member(i)
	m.life.Lock()
	defer m.life.Unlock()
	if m.running() {
		return fmt.Errorf("etcdtest: restore %s: the member runs; stop it first", m.name)
	}
	if err := os.RemoveAll(m.dir); err != nil {
		return fmt.Errorf("etcdtest: restore %s: %w", m.name, err)
	}
	if err := os.CopyFS(m.dir, os.DirFS(backup)); err != nil {
		return fmt.Errorf("etcdtest: restore %s: %w", m.name, err)
	}
	return nil
}
