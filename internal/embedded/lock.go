package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// lockFile is the name of the lock file in a store directory.
const lockFile = "jetbridge.lock"

// storeLock is an exclusive flock(2) on the store directory's lock file,
// held while the server runs. The kernel drops it when the process dies,
// so a crashed bridge never leaves a stale lock behind; the file stays,
// holding the last holder's process id.
type storeLock struct {
	once sync.Once
	f    *os.File
}

// lockStoreDir creates dir if needed and takes its lock, or returns a
// *StoreDirLockedError naming the holder.
func lockStoreDir(dir string) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: store dir: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("embedded: store dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			buf := make([]byte, 32)
			n, _ := f.ReadAt(buf, 0)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
			return nil, &StoreDirLockedError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("embedded: store dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f}, nil
}

// release drops the lock; nil and repeated calls are no-ops.
func (l *storeLock) release() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		_ = l.f.Close()
	})
}
