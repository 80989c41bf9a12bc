package embedded

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// lockFile is the name of the lock file in a store directory.
const lockFile = "jetbridge.lock"

// lockOpenFlags open the lock file for locking: created if missing, never
// truncated by the open, never through a symbolic link (O_NOFOLLOW: a link
// planted in a writable store directory must not make the bridge truncate
// and overwrite the file it points to), and without blocking on a named
// pipe or device (O_NONBLOCK).
const lockOpenFlags = os.O_RDWR | os.O_CREATE | syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// UnsafeLockFileError is the error of Start when the store directory's
// lock file is a symbolic link, not a regular file, or a regular file
// with other hard links: the server refuses to open (or write) it. It
// matches ErrUnsafeLockFile.
type UnsafeLockFileError struct {
	Path   string // absolute path of the lock file
	Reason string // e.g. "a symbolic link to /etc/passwd"
}

func (e *UnsafeLockFileError) Error() string {
	return fmt.Sprintf("embedded: store dir lock file %s is %s; refusing to use it "+
		"(the server creates its own lock file: remove this one, and make sure no other user can write to the store dir)", e.Path, e.Reason)
}

func (e *UnsafeLockFileError) Is(target error) bool { return target == ErrUnsafeLockFile }

// storeLock is an exclusive flock(2) on the store directory's lock file,
// held while the server runs. The kernel drops it when the process dies,
// so a crashed bridge never leaves a stale lock behind; the file stays,
// holding the last holder's process id.
type storeLock struct {
	once sync.Once
	f    *os.File
}

// lockStoreDir creates dir if needed and takes its lock, or returns a
// *StoreDirLockedError naming the holder, or an *UnsafeLockFileError.
func lockStoreDir(dir string) (*storeLock, error) { return lockStoreDirWith(dir, lockOpenFlags) }

// lockStoreDirWith is lockStoreDir with the open flags as a parameter (the
// tests show what happens without O_NOFOLLOW).
func lockStoreDirWith(dir string, flags int) (*storeLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: store dir: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, flags, 0o640)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			reason := "a symbolic link"
			if target, rerr := os.Readlink(path); rerr == nil {
				reason += " to " + target
			}
			return nil, &UnsafeLockFileError{Path: path, Reason: reason}
		}
		return nil, fmt.Errorf("embedded: store dir lock: %w", err)
	}
	if err := checkLockFile(f, path); err != nil {
		f.Close()
		return nil, err
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

// checkLockFile refuses an opened lock file that is not a regular file, or
// that has other hard links (writing to it would change another file).
func checkLockFile(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("embedded: store dir lock %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return &UnsafeLockFileError{Path: path, Reason: "not a regular file (" + fileType(fi.Mode()) + ")"}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		return &UnsafeLockFileError{Path: path, Reason: fmt.Sprintf("a regular file with %d hard links", st.Nlink)}
	}
	return nil
}

// fileType names the type of a file that is not a regular one.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeDir != 0:
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "mode " + m.String()
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
